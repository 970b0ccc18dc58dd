"""Tables, JSON and plots of ``zeppelin compare-dp`` from the runner's per-rank records.

Definitions (per balance mode, variant and world size W; times from rank 0, whose step ends at the
loss all-reduce, so it is the slowest rank's time): epoch = the ``steps`` global batches of the run;
step = the median step time excluding the first (warm-up: lazy allocations, FSDP's lazy init);
throughput = global tokens per step / step; speedup = step(W=1) / step(W); efficiency = speedup / W;
memory = the largest per-rank peak of tracked tensor bytes (measure.py) and its prediction (memory.py).

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


def summarize(records: List[dict]) -> List[dict]:
    groups: Dict[tuple, List[dict]] = defaultdict(list)
    for r in records:
        groups[(r["balance"], r["variant"], r["world"])].append(r)
    rows = []
    for (balance, variant, world), rs in groups.items():
        r0 = min(rs, key=lambda r: r["rank"])
        step = statistics.median(r0["step_s"][1:]) if len(r0["step_s"]) > 1 else r0["step_s"][0]
        meas = max((r["mem"].get("total", 0) for r in rs), default=0)
        worst = max(rs, key=lambda r: r["mem"].get("total", 0))
        pred = worst.get("mem_pred", {}).get("total", 0)
        rows.append({"balance": balance, "variant": variant, "world": world, "epoch_s": sum(r0["step_s"]),
                     "step_s": step, "throughput_tok_s": r0["tokens_per_step"] / step,
                     "final_loss": r0["losses"][-1], "losses": r0["losses"],
                     "mem_measured_bytes": meas, "mem_predicted_bytes": pred,
                     "mem_error": (pred - meas) / meas if meas else None,
                     "rss_peak_bytes": max(r["rss_peak_bytes"] for r in rs)})
    base = {(r["balance"], r["variant"]): r["step_s"] for r in rows if r["world"] == 1}
    for r in rows:
        b = base.get((r["balance"], r["variant"]))
        r["speedup"] = b / r["step_s"] if b else None
        r["efficiency"] = r["speedup"] / r["world"] if b else None
    rows.sort(key=lambda r: (r["balance"], r["world"], r["variant"]))
    return rows


def format_table(rows: List[dict]) -> str:
    head = (f"{'balance':>7} {'W':>2} {'variant':<10} {'epoch s':>8} {'step ms':>8} {'tok/s':>8} "
            f"{'speedup':>7} {'eff':>5} {'mem MB':>7} {'pred MB':>7} {'err':>6} {'rss MB':>7} {'loss':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        f = lambda x, fmt: format(x, fmt) if x is not None else "-"  # noqa: E731
        lines.append(f"{'on' if r['balance'] else 'off':>7} {r['world']:>2} {r['variant']:<10} {r['epoch_s']:>8.2f} "
                     f"{r['step_s'] * 1e3:>8.0f} {r['throughput_tok_s']:>8.0f} {f(r['speedup'], '7.2f'):>7} "
                     f"{f(r['efficiency'], '5.2f'):>5} {r['mem_measured_bytes'] / 1e6:>7.1f} "
                     f"{r['mem_predicted_bytes'] / 1e6:>7.1f} {f(r['mem_error'], '+6.1%'):>6} "
                     f"{r['rss_peak_bytes'] / 1e6:>7.0f} {r['final_loss']:>7.4f}")
    return "\n".join(lines)


def max_loss_gap(rows: List[dict]) -> float:
    """Largest |loss - loss of the first row| over all rows and steps (same math => ~1e-6)."""
    ref = rows[0]["losses"]
    return max(abs(a - b) for r in rows for a, b in zip(r["losses"], ref))


def write_outputs(rows: List[dict], records: List[dict], out_dir: str, meta: dict) -> Dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "compare_dp.json")}
    with open(paths["json"], "w") as f:
        json.dump({"meta": meta, "rows": rows, "records": records}, f, indent=1)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths["loss"] = os.path.join(out_dir, "compare_dp_loss.png")
    modes = sorted({r["balance"] for r in rows})
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4), squeeze=False, constrained_layout=True)
    for ax, mode in zip(axes[0], modes):
        for r in (r for r in rows if r["balance"] == mode):
            ax.plot(range(len(r["losses"])), r["losses"], marker="o", ms=3, alpha=0.7,
                    label=f"{r['variant']} W={r['world']}")
        ax.set(title=f"loss, zeppelin-balance {'on' if mode else 'off'}", xlabel="step", ylabel="loss")
        ax.legend(fontsize=6, ncol=2)
    fig.savefig(paths["loss"], dpi=110)
    plt.close(fig)

    paths["throughput"] = os.path.join(out_dir, "compare_dp_throughput.png")
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    worlds = sorted({r["world"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(13, 4), constrained_layout=True)
    width = 0.8 / max(1, len(worlds) * len(modes))
    for k, (mode, w) in enumerate((m, w) for m in modes for w in worlds):
        vals = [next((r["throughput_tok_s"] for r in rows if r["variant"] == v and r["world"] == w
                      and r["balance"] == mode), 0) for v in variants]
        mem = [next((r["mem_measured_bytes"] / 1e6 for r in rows if r["variant"] == v and r["world"] == w
                     and r["balance"] == mode), 0) for v in variants]
        xs = [i + k * width for i in range(len(variants))]
        lab = f"W={w} balance {'on' if mode else 'off'}"
        axes[0].bar(xs, vals, width, label=lab)
        axes[1].bar(xs, mem, width, label=lab)
    for ax, t in zip(axes, ("throughput (tokens/s)", "peak tracked tensor memory per rank (MB)")):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(variants))], variants)
        ax.set_title(t)
        ax.legend(fontsize=7)
    fig.savefig(paths["throughput"], dpi=110)
    plt.close(fig)
    return paths
