"""validation_probes/bench_host_cores.py: its summary of per-round cores (the timings are a benchmark, never
asserted) and a short run of pinned workers writing its JSON."""

import json
import os

from bench_scripts import load_probe


def test_summary_counts_low_rounds():
    s = load_probe("bench_host_cores").summarise([2.0, 1.9, 1.1, 1.5], 2)
    assert s["rounds"] == 4 and s["min"] == 1.1 and s["max"] == 2.0 and s["median"] == 1.7
    assert s["low_rounds"] == 2 and s["low_share"] == 0.5  # 1.1 and 1.5: at most 2 - 0.5


def test_short_run_writes_json(tmp_path):
    out = tmp_path / "cores.json"
    assert load_probe("bench_host_cores").main(["--rounds", "2", "--iters", "1", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    cpus = len(os.sched_getaffinity(0))
    assert d["summary"]["rounds"] == len(d["rounds"]) == 2 and len(d["cpus"]) == cpus
    assert all(len(r["alone_s"]) == len(r["together_s"]) == cpus and r["cores"] > 0 for r in d["rounds"])
