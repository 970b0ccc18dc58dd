"""benchmarks/bench_kernels.py (what scripts/gpu_check.sh runs on a GPU) runs on CPU at a toy size:
its three ways agree and make 1, 1 and one-per-document kernel calls (timings are not asserted)."""

import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_kernels_runs_and_counts_calls(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_kernels", os.path.join(ROOT, "benchmarks", "bench_kernels.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "k.json"
    bench.main(["--device", "cpu", "--dtype", "float64", "--tokens", "300", "--max-len", "120", "--heads", "2",
                "--kv-heads", "1", "--head-dim", "8", "--repeats", "1", "--out", str(out)])
    r = json.loads(out.read_text())
    assert r["kernel"] == "cpu_flash" and r["documents"] >= 2
    calls = {k: w["kernel_calls_fwd"] for k, w in r["ways"].items()}
    assert calls == {"zeppelin_local_queue": 1, "packed_varlen": 1, "per_document": r["documents"]}
    assert r["queue_vs_packed_max_abs_diff"] < 1e-12
