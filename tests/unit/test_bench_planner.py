"""benchmarks/bench_planner.py: a run case plans the run's own batches (sim/runs.py) with one Planner
(the times are a benchmark, never asserted)."""

from bench_scripts import load_bench

from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.sim.runs import RunSpec, domain_topology, run_lengths


def test_a_run_case_plans_the_runs_batches(monkeypatch):
    bench = load_bench("bench_planner")
    case = ("a800", "llama-7b", 1, "github", 16384, 1, 4096, "none")  # no recompute: the planner's capacity
    monkeypatch.setattr(bench, "RUN_CASES", (case,))
    r = bench.run_latency(0, repeats=1)
    prof = load_profile("a800")
    topo = domain_topology(prof, 1)
    batches = run_lengths(RunSpec("latency", *case[:7], batches=3), topo.world_size)
    assert r["docs"] == [len(b) for b in batches] and r["ranks"] == 8
    assert 0 < r["min_ms"] <= r["median_ms"] and len(r["batch_ms"]) == len(r["predicted_iteration_s"]) == 3
