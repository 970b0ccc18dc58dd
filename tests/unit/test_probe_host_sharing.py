"""validation_probes/bench_host_sharing.py: its summary turns alone / together / engine timings into the
cores the ranks got and the CPU inflation (the timings themselves are a benchmark, never asserted)."""

from bench_scripts import load_probe


def test_summary_gives_cores_and_cpu_inflation():
    # 2 ranks, 1 repeat: each 1 s of work alone (1 CPU s); together both done after 1.25 s with
    # 1.1 and 1.3 CPU s; the whole engine pass 2 s with 1.5 CPU s each.
    per_rank = {"s": [((1.0, 1.0), (1.25, 1.1), (2.0, 1.5))]}
    res = [(None, per_rank), (None, {"s": [((1.0, 1.0), (1.2, 1.3), (1.8, 1.5))]})]
    row = load_probe("bench_host_sharing").summarise(res, ("s",), 1)["s"]
    assert row["cores"] == [1.6]                  # 2 s of work in 1.25 s
    assert row["cpu_inflation"] == [1.2]          # median of 1.1 and 1.3
    assert row["engine_cores"] == [1.0] and row["engine_cpu_inflation"] == [1.5]


def test_summary_gives_computes_alone_over_the_model():
    # The same timings with each rank's model seconds (1.0 and 0.8): alone 1 + 1 CPU s over 1.8.
    per = [((1.0, 1.0), (1.25, 1.1), (2.0, 1.5))]
    res = [(None, {"s": per}, {"s": 1.0}), (None, {"s": per}, {"s": 0.8})]
    row = load_probe("bench_host_sharing").summarise(res, ("s",), 1)["s"]
    assert row["alone_over_model"] == round(2.0 / 1.8, 3)
