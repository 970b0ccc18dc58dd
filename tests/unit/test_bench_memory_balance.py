"""benchmarks/bench_memory_balance.py: its *spread* placement is a valid Zeppelin plan (every
invariant of check_plan), long documents on aligned power-of-two blocks, short ones within the
per-rank token cap (the prices are a benchmark, never asserted)."""

import math

from bench_scripts import load_bench

from megatron_zeppelin.planner.build.assemble import assemble
from megatron_zeppelin.planner.build.checks import check_plan
from megatron_zeppelin.planner.testing import toy_context
from megatron_zeppelin.planner.partitioner.thresholds import zeppelin_thresholds


def test_spread_placement_is_a_valid_plan():
    bench = load_bench("bench_memory_balance")
    ctx = toy_context(nodes=2, gpus=4)
    lengths = [40000, 30000, 9000] + [300 + 37 * i for i in range(40)]
    local_max = zeppelin_thresholds(ctx).local_max
    pl = bench.spread_placement(lengths, ctx, chunk=8000)
    plan = assemble("zeppelin", lengths, ctx, pl)
    check_plan(plan)
    for r in plan.rings:  # aligned blocks: G consecutive ranks starting at a multiple of G
        assert r.size & (r.size - 1) == 0 and r.ranks == tuple(range(r.ranks[0], r.ranks[0] + r.size))
        assert r.ranks[0] % r.size == 0
    split = {d for r in plan.rings for d in r.docs}
    assert {i for i, L in enumerate(lengths) if L > local_max and L > 8000} <= split
    cap = math.ceil(bench.TOKEN_SLACK * sum(lengths) / ctx.topology.world_size)
    assert max(sum(len(s) for s in segs) for segs in plan.attention_layout) <= cap  # every rank within the cap
