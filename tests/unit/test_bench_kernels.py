"""benchmarks/bench_kernels.py (what scripts/gpu_check.sh runs on a GPU) runs on CPU at a toy size:
its three ways agree and make 1, 1 and one-per-document kernel calls (timings are not asserted)."""

import json

from bench_scripts import load_bench


def test_bench_kernels_runs_and_counts_calls(tmp_path):
    bench = load_bench("bench_kernels")
    out = tmp_path / "k.json"
    bench.main(["--device", "cpu", "--dtype", "float64", "--tokens", "300", "--max-len", "120", "--heads", "2",
                "--kv-heads", "1", "--head-dim", "8", "--repeats", "1", "--out", str(out)])
    r = json.loads(out.read_text())
    assert r["kernel"] == "cpu_flash" and r["documents"] >= 2
    calls = {k: w["kernel_calls_fwd"] for k, w in r["ways"].items()}
    assert calls == {"zeppelin_local_queue": 1, "packed_varlen": 1, "per_document": r["documents"]}
    assert r["queue_vs_packed_max_abs_diff"] < 1e-12
