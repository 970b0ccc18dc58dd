"""validation_probes/bench_host_drift.py: its summary of per-window rates (the timings are a benchmark,
never asserted) and a short run writing its JSON."""

import json

from bench_scripts import load_probe


def test_summary_spread():
    s = load_probe("bench_host_drift").summarise([50.0, 40.0, 60.0, 50.0])
    assert s["windows"] == 4 and s["min"] == 40.0 and s["max"] == 60.0 and s["median"] == 50.0
    assert s["p5"] < s["median"] < s["p95"] and s["p95_over_p5"] > 1.0


def test_short_run_writes_json(tmp_path):
    out = tmp_path / "drift.json"
    assert load_probe("bench_host_drift").main(["--seconds", "0.3", "--window", "0.1", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["summary"]["windows"] == len(d["rates"]) >= 2 and all(r > 0 for r in d["rates"])
