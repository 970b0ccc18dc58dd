"""Collect measured throughput from the logs of rendered SLURM jobs (Megatron's log format).

Each job log starts with the job script's header ``[zeppelin-slurm] run=NAME mode=MODE ...
tokens_per_iteration=N`` and then Megatron's per-iteration lines. The first ``warmup`` iterations are
dropped; the median of the rest is the iteration time, and tokens per second is the run's tokens per
iteration (the same in every mode of a run) over it: the number the modes are compared by.

>>> log = '''[zeppelin-slurm] run=7b mode=cp_p2p nodes=2 gpus_per_node=8 world=16 tokens_per_iteration=1048576
...  [2026-01-01 00:00:01] iteration        1/      50 | elapsed time per iteration (ms): 9000.0 | lm loss: 9.1 |
...  [2026-01-01 00:00:02] iteration        2/      50 | elapsed time per iteration (ms): 1200.0 | lm loss: 8.9 |
...  [2026-01-01 00:00:03] iteration        3/      50 | elapsed time per iteration (ms): 1000.0 | lm loss: 8.7 |
...  [2026-01-01 00:00:04] iteration        4/      50 | elapsed time per iteration (ms): 1024.0 | lm loss: 8.6 |'''
>>> r = parse_log(log, warmup=1)
>>> r["strategy"], r["iteration_s"], r["tokens_per_s"], r["iterations"], r["final_loss"]
('static_cp', 1.024, 1024000.0, 3, 8.6)
"""

from __future__ import annotations

import csv
import glob
import json
import os
import re
import statistics
from typing import Dict, List, Optional

STRATEGY_OF_MODE = {"zeppelin": "zeppelin", "dp": "packed_dp", "cp_p2p": "static_cp",
                    "cp_a2a_p2p": "static_cp_hier", "cp_all_gather": "allgather_cp"}
_HEAD = re.compile(r"\[zeppelin-slurm\] run=(\S+) mode=(\S+) nodes=(\d+) gpus_per_node=(\d+)"
                   r"(?: world=(\d+))?(?: tokens_per_iteration=(\d+))?")
_ITER = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)")
_LOSS = re.compile(r"lm loss: ([\d.eE+-]+)")


def parse_log(text: str, warmup: int = 3) -> Optional[Dict]:
    head = _HEAD.search(text)
    if not head:
        return None
    times, loss = [], None
    for line in text.splitlines():
        m = _ITER.search(line)
        if m:
            if int(m.group(1)) > warmup:
                times.append(float(m.group(2)) / 1e3)
            lm = _LOSS.search(line)
            loss = float(lm.group(1)) if lm else loss
    run, mode, nodes, gpn, _, tokens = head.groups()
    it = statistics.median(times) if times else None
    tokens = int(tokens) if tokens else None
    return {"run": run, "mode": mode, "strategy": STRATEGY_OF_MODE.get(mode, mode), "nodes": int(nodes),
            "gpus_per_node": int(gpn), "tokens_per_iteration": tokens,
            "tokens_per_s": round(tokens / it, 1) if (tokens and it) else None, "iteration_s": it,
            "iterations": len(times), "final_loss": loss, "source": "measured"}


def collect(log_dir: str, warmup: int = 3) -> List[Dict]:
    out = []
    for path in sorted(glob.glob(os.path.join(log_dir, "*.log"))):
        with open(path, errors="replace") as f:
            rec = parse_log(f.read(), warmup)
        if rec:
            rec["log"] = path
            out.append(rec)
    return out


def table(records: List[Dict]) -> str:
    """One line per job, runs together, fastest (tokens/s) first; speed-up over the run's dp job."""
    lines = [f"{'run':<20} {'mode':<14} {'strategy':<15} {'tokens/s':>12} {'iteration':>11} {'vs dp':>7} {'iters':>5}"]
    for run in sorted({r["run"] for r in records}):
        rs = sorted((r for r in records if r["run"] == run), key=lambda r: -(r["tokens_per_s"] or 0))
        dp = next((r["tokens_per_s"] for r in rs if r["mode"] == "dp" and r["tokens_per_s"]), None)
        for r in rs:
            tps = "n/a" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.1f}"
            it = "n/a" if r["iteration_s"] is None else f"{r['iteration_s']:.3f}s"
            vs = f"{r['tokens_per_s'] / dp:.2f}x" if (dp and r["tokens_per_s"]) else "-"
            lines.append(f"{run:<20} {r['mode']:<14} {r['strategy']:<15} {tps:>12} {it:>11} {vs:>7} {r['iterations']:>5}")
    return "\n".join(lines)


def write_results(records: List[Dict], json_path: Optional[str], csv_path: Optional[str]) -> None:
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"runs": records}, f, indent=2)
    if csv_path and records:
        keys = list(records[0])
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(records)
