"""benchmarks/bench_balance_memory.py: one batch of its first run, planned without and with
--zeppelin-balance-memory (the times and prices are a benchmark, never asserted)."""

from bench_scripts import load_bench


def test_one_batch_without_and_with_the_flag():
    bench = load_bench("bench_balance_memory")
    rows = bench.run_case(bench.RUNS[0], batches=1, repeats=1)
    assert len(rows) == 1
    d, m = rows[0]["default"], rows[0]["balance_memory"]
    assert d["memory_imbalance"] > bench.BALANCE >= m["memory_imbalance"]  # this run's first batch: imbalanced by default
    assert d["token_cap"] is None and m["token_cap"] > 0
    s = bench.summarize(rows)
    assert s["memory_balance_memory"]["within_1.10"] == 1 and s["memory_default"]["within_1.10"] == 0
    assert s["price"]["mean"] == m["predicted_s"] / d["predicted_s"]
