"""Collect measured iteration times from the logs of rendered SLURM jobs (Megatron's log format).

Each job log starts with ``[zeppelin-slurm] run=NAME mode=MODE ...`` (written by the job script) and then
Megatron's per-iteration lines. The first ``warmup`` iterations are dropped; the median of the rest is
the measured iteration time, in the same record shape the simulator writes (strategy, iteration_s).

>>> log = '''[zeppelin-slurm] run=7b mode=cp_p2p nodes=2 gpus_per_node=8
...  [2026-01-01 00:00:01] iteration        1/      50 | elapsed time per iteration (ms): 9000.0 | lm loss: 9.1 |
...  [2026-01-01 00:00:02] iteration        2/      50 | elapsed time per iteration (ms): 1200.0 | lm loss: 8.9 |
...  [2026-01-01 00:00:03] iteration        3/      50 | elapsed time per iteration (ms): 1000.0 | lm loss: 8.7 |
...  [2026-01-01 00:00:04] iteration        4/      50 | elapsed time per iteration (ms): 1100.0 | lm loss: 8.6 |'''
>>> parse_log(log, warmup=1)
{'run': '7b', 'mode': 'cp_p2p', 'strategy': 'static_cp', 'nodes': 2, 'gpus_per_node': 8, 'iteration_s': 1.1, 'iterations': 3, 'final_loss': 8.6, 'source': 'measured'}
"""

from __future__ import annotations

import csv
import glob
import json
import os
import re
import statistics
from typing import Dict, List, Optional

STRATEGY_OF_MODE = {"zeppelin": "zeppelin", "dp": "packed_dp", "cp_p2p": "static_cp", "cp_a2a_p2p": "static_cp_hier"}
_HEAD = re.compile(r"\[zeppelin-slurm\] run=(\S+) mode=(\S+) nodes=(\d+) gpus_per_node=(\d+)")
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
    run, mode, nodes, gpn = head.groups()
    return {"run": run, "mode": mode, "strategy": STRATEGY_OF_MODE.get(mode, mode), "nodes": int(nodes),
            "gpus_per_node": int(gpn), "iteration_s": statistics.median(times) if times else None,
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
