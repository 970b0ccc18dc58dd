"""Tables, JSON and plots of ``zeppelin compare-dp`` from the runner's per-rank records.

Definitions (per model, balance mode, variant and world size W; times from rank 0, whose step ends
at the loss all-reduce, so it is the slowest rank's time): epoch = the run's global batches (one
pass over the corpus with ``--epoch``); step = the median step time excluding the first (warm-up:
lazy allocations, FSDP's lazy init); throughput = global tokens per step / step; speedup =
step of the plain single-process run (variant ``single``, W=1; else the same variant at W=1) /
step(W); efficiency = speedup / W; exposed communication = median over timed steps of the time
from the end of the backward's computation to gradients ready, plus the post-step parameter
all-gather; traffic = the gradient group's collectives in one step (size and ring bytes sent per
rank, traffic.py); memory = the largest per-rank peak of tracked tensor bytes, by category
(measure.py), and its prediction (memory.py).

>>> rows = summarize([{"variant": "naive", "balance": False, "world": 1, "rank": 0, "losses": [2.0, 1.0],
...     "step_s": [1.0, 0.5], "tokens_per_step": 100, "mem": {"total": 10}, "mem_pred": {"total": 11},
...     "rss_peak_bytes": 5}])
>>> rows[0]["throughput_tok_s"], rows[0]["speedup"], rows[0]["mem_error"]
(200.0, 1.0, 0.1)
"""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from typing import Dict, List

from megatron_zeppelin.plots.dp_study import plot_all  # matplotlib is imported only when it draws

CATEGORIES = ("param", "grad", "opt", "act")  # MemTracker's: parameters, gradients, optimizer states, activations


def _med(xs):
    xs = list(xs)
    return statistics.median(xs[1:]) if len(xs) > 1 else (xs[0] if xs else 0.0)


def summarize(records: List[dict]) -> List[dict]:
    groups: Dict[tuple, List[dict]] = defaultdict(list)
    for r in records:
        groups[(r.get("model", ""), r["balance"], r["variant"], r["world"])].append(r)
    rows = []
    for (model, balance, variant, world), rs in groups.items():
        r0 = min(rs, key=lambda r: r["rank"])
        step = _med(r0["step_s"])
        worst = max(rs, key=lambda r: r["mem"].get("total", 0))
        meas = worst["mem"].get("total", 0)
        pred = worst.get("mem_pred", {}).get("total", 0)
        traffic = r0.get("traffic", {})
        rows.append({"model": model, "balance": balance, "variant": variant, "world": world,
                     "epoch_s": sum(r0["step_s"]), "steps": len(r0["step_s"]),
                     "step_s": step, "throughput_tok_s": r0["tokens_per_step"] / step,
                     "exposed_comm_s": max(_med(r.get("exposed_comm_s", [0.0])) for r in rs),
                     "comm_size_bytes": traffic.get("size_bytes", 0), "comm_sent_bytes": traffic.get("sent_bytes", 0),
                     "collectives": traffic.get("ops", {}),
                     "final_loss": r0["losses"][-1], "losses": r0["losses"], "step_times": r0["step_s"],
                     "mem_measured_bytes": meas, "mem_predicted_bytes": pred,
                     "mem_by_category": {c: worst["mem"].get(c, 0) for c in CATEGORIES},
                     "mem_pred_by_category": {k: worst.get("mem_pred", {}).get(k, 0)
                                              for k in ("weights", "gradients", "optimizer", "activations")},
                     "mem_error": (pred - meas) / meas if meas else None,
                     "rss_peak_bytes": max(r["rss_peak_bytes"] for r in rs)})
    single = {(r["model"], r["balance"]): r["step_s"] for r in rows if r["variant"] == "single"}
    own = {(r["model"], r["balance"], r["variant"]): r["step_s"] for r in rows if r["world"] == 1}
    for r in rows:
        b = single.get((r["model"], r["balance"])) or own.get((r["model"], r["balance"], r["variant"]))
        r["speedup"] = b / r["step_s"] if b else None
        r["efficiency"] = r["speedup"] / r["world"] if b else None
    rows.sort(key=lambda r: (r["model"], r["balance"], r["world"], r["variant"] != "single", r["variant"]))
    return rows


def format_table(rows: List[dict]) -> str:
    M = 1e6
    head = (f"{'model':<8} {'bal':>3} {'W':>2} {'variant':<10} {'epoch s':>8} {'step ms':>8} {'tok/s':>7} "
            f"{'speedup':>7} {'eff':>5} {'exp ms':>6} {'comm MB':>7} {'sent MB':>7} | {'param':>6} {'grad':>6} "
            f"{'opt':>6} {'act':>6} {'peak MB':>7} {'pred MB':>7} | {'loss':>7}")
    lines = [head, "-" * len(head)]
    f = lambda x, fmt: format(x, fmt) if x is not None else "-"  # noqa: E731
    for r in rows:
        c = r["mem_by_category"]
        lines.append(f"{r['model'][:8]:<8} {'on' if r['balance'] else 'off':>3} {r['world']:>2} {r['variant']:<10} "
                     f"{r['epoch_s']:>8.2f} {r['step_s'] * 1e3:>8.0f} {r['throughput_tok_s']:>7.0f} "
                     f"{f(r['speedup'], '7.2f'):>7} {f(r['efficiency'], '5.2f'):>5} {r['exposed_comm_s'] * 1e3:>6.1f} "
                     f"{r['comm_size_bytes'] / M:>7.2f} {r['comm_sent_bytes'] / M:>7.2f} | "
                     + " ".join(f"{c[k] / M:>6.1f}" for k in CATEGORIES)
                     + f" {r['mem_measured_bytes'] / M:>7.1f} {r['mem_predicted_bytes'] / M:>7.1f} | {r['final_loss']:>7.4f}")
    return "\n".join(lines)


def max_loss_gap(rows: List[dict]) -> float:
    """Largest |loss - loss of the first row of the same model| over all rows and steps (same math => ~1e-6)."""
    gap = 0.0
    for model in {r["model"] for r in rows}:
        rs = [r for r in rows if r["model"] == model]
        ref = rs[0]["losses"]
        gap = max([gap] + [abs(a - b) for r in rs for a, b in zip(r["losses"], ref)])
    return gap


def write_outputs(rows: List[dict], records: List[dict], out_dir: str, meta: dict) -> Dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "compare_dp.json")}
    with open(paths["json"], "w") as f:
        json.dump({"meta": meta, "rows": rows, "records": records}, f, indent=1)
    paths.update(plot_all(rows, out_dir))
    return paths
