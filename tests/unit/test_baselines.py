"""Baseline strategies: hand-checked cases, plan invariants on random batches, best-setting choice,
determinism and flag-naming errors."""

import random

import pytest
from hypothesis import given, settings, strategies as st

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.planner import plan_batch
from megatron_zeppelin.planner.baselines.cp_groups import member_tokens
from megatron_zeppelin.planner.baselines.dynamic_cp import dynamic_cp_placement, gpus_needed
from megatron_zeppelin.planner.baselines.hybrid_dp import doc_flops
from megatron_zeppelin.planner.build.checks import check_plan
from megatron_zeppelin.planner.errors import PlanError
from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE, toy_context
from megatron_zeppelin.spec.topology import Topology

BASELINES = ("static_cp", "allgather_cp", "hybrid_dp", "dynamic_cp")


def plan(lengths, nodes=2, gpus=4, strategy="static_cp", **cfg):
    config = ZeppelinConfig(gpus_per_node=gpus, **cfg)
    return plan_batch(lengths, Topology(nodes, gpus), TOY_PROFILE, TOY_MODEL, config, strategy=strategy)


def long_tail(n, seed, top=6000):
    rng = random.Random(seed)
    return [min(top, max(1, int(rng.lognormvariate(5.5, 1.3)))) for _ in range(n)]


# --- static_cp / allgather_cp -------------------------------------------------------------------
def test_static_cp_fixed_sizes_and_classes():
    lengths = [40, 30, 20, 10, 7, 3]
    p1 = plan(lengths, cp_size=1, capacity_tokens=100)
    assert p1.class_counts() == {"inter": 0, "intra": 0, "local": 6} and not p1.rings
    # 4 DP groups of 2: LPT by TE's padded tokens (multiples of 2 x 2: 40, 32, 20, 12, 8, 4): {40}, {30},
    # {20, 3}, {10, 7}
    p2 = plan(lengths, cp_size=2, capacity_tokens=100)
    assert [(r.ranks, r.docs, r.cls) for r in p2.rings] == [
        ((0, 1), (0,), "intra"), ((2, 3), (1,), "intra"), ((4, 5), (2, 5), "intra"), ((6, 7), (3, 4), "intra")]
    assert [d.padded for d in p2.docs] == [0, 32, 0, 12, 8, 4] and p2.meta.pad_multiple == 4
    p8 = plan(lengths, cp_size=8, capacity_tokens=100)  # one group over both nodes: inter, every document zigzag over 8
    assert [(r.ranks, r.cls) for r in p8.rings] == [(tuple(range(8)), "inter")]
    assert all(d.cls == "inter" and len(d.bounds) == 17 for d in p8.docs)
    for p in (p1, p2, p8):
        check_plan(p)
        assert dict(p.meta)["cp_size"] in ("1", "2", "8") and not p.remap
        assert all(o.stage == "direct" for o in p.schedule)  # routing off


@pytest.mark.parametrize("comm, cp", [("p2p", 4), ("a2a", 2), ("a2a+p2p", 4), ("allgather", 4)])
def test_te_padding_is_charged_not_run(comm, cp):
    """TE's THD CP pads each document to a multiple of 2 x cp (planner/build/padding.py): the plan
    keeps the real rows (what the engine runs), prediction, simulation and memory charge the padded."""
    from megatron_zeppelin.planner.baselines.static_cp import cp_placement
    from megatron_zeppelin.planner.build.assemble import assemble
    from megatron_zeppelin.sim.iteration import simulate
    from megatron_zeppelin.spec.memory import plan_memory_balance
    lengths = [61, 37, 9, 5]  # none a multiple of 2 x cp
    cfg = ZeppelinConfig(gpus_per_node=4, capacity_tokens=1000)
    ctx = toy_context(nodes=2, gpus=4, config=cfg, capacity=1000)
    a2a = 2 if comm == "a2a+p2p" else 1
    plans = {pad: assemble("static_cp", lengths, ctx, cp_placement(lengths, ctx, cp, comm, a2a, pad=pad))
             for pad in (False, True)}
    padded, bare = plans[True], plans[False]
    assert [d.padded for d in padded.docs] == [-(-L // (2 * cp)) * 2 * cp for L in lengths]
    assert not any(d.padded for d in bare.docs) and padded.meta.pad_multiple == 2 * cp
    assert padded.attention_layout == bare.attention_layout and padded.schedule == bare.schedule  # the engine's
    check_plan(padded)
    assert padded.predicted_iteration_s > bare.predicted_iteration_s
    sim = {k: simulate(p, TOY_PROFILE, TOY_MODEL).iteration_s for k, p in plans.items()}
    assert sim[True] > sim[False]
    mem = {k: sum(plan_memory_balance(p, TOY_MODEL)["bytes"]) for k, p in plans.items()}
    assert mem[True] > mem[False]  # the pad rows are held


def test_allgather_cp_holds_the_gathered_kv():
    from megatron_zeppelin.spec.memory import gathered_kv_bytes, plan_memory_balance
    lengths = [64, 40, 16, 8]
    ag, p2p = plan(lengths, strategy="allgather_cp", cp_size=4), plan(lengths, strategy="static_cp", cp_size=4,
                                                                      cp_comm="p2p")
    assert [(r.ranks, r.docs) for r in ag.rings] == [(r.ranks, r.docs) for r in p2p.rings]
    extra = gathered_kv_bytes(ag, TOY_MODEL)
    assert gathered_kv_bytes(p2p, TOY_MODEL) == [0] * 8 and min(extra) > 0
    ag_mem, p2p_mem = plan_memory_balance(ag, TOY_MODEL)["bytes"], plan_memory_balance(p2p, TOY_MODEL)["bytes"]
    assert [a - b for a, b in zip(ag_mem, p2p_mem)] == extra


def test_allgather_cp_uses_allgather_rings():
    p = plan([40, 30, 20, 10], strategy="allgather_cp", cp_size=4)
    assert {(r.ranks, r.comm) for r in p.rings} == {((0, 1, 2, 3), "allgather"), ((4, 5, 6, 7), "allgather")}
    assert {o.step for o in p.schedule} == {0}  # one gather, not a ring
    check_plan(p)


@pytest.mark.parametrize("strategy", ["static_cp", "allgather_cp"])
def test_best_cp_is_the_predicted_fastest(strategy):
    lengths = long_tail(60, seed=3)
    auto = plan(lengths, strategy=strategy)
    times = {cp: plan(lengths, strategy=strategy, cp_size=cp).predicted_iteration_s for cp in (1, 2, 4, 8)}
    chosen = int(dict(auto.meta)["cp_size"])
    assert auto.predicted_iteration_s == pytest.approx(min(times.values()), rel=1e-12)
    assert times[chosen] == min(times.values())
    assert len(dict(auto.meta)["cp_size_predicted_s"].split(",")) == 4


def test_cp_size_errors_name_the_flag():
    with pytest.raises(ZeppelinError, match="--zeppelin-cp-size"):
        plan([10, 20], nodes=1, gpus=4, cp_size=8)
    with pytest.raises(ZeppelinError, match="--zeppelin-capacity-tokens"):
        plan([100, 5], nodes=1, gpus=4, cp_size=1, capacity_tokens=60)


# --- hybrid_dp ----------------------------------------------------------------------------------
def test_hybrid_dp_long_split_short_local_balanced_by_flops():
    ctx = toy_context(nodes=2, gpus=4)
    lengths = [2500] + [300 + 7 * k for k in range(30)]
    p = plan(lengths, strategy="hybrid_dp")
    share = sum(doc_flops(L, ctx.cost) for L in lengths) / 8
    d0 = p.docs[0]
    g = len(p.rings[d0.ring].ranks)
    # smallest power-of-two group whose per-rank FLOPs fit the share
    assert 1 < g < 8 and doc_flops(2500, ctx.cost) / g <= share < doc_flops(2500, ctx.cost) / (g // 2)
    assert all(d.cls == "local" for d in p.docs[1:])
    ring = p.rings[d0.ring]
    assert ring.ranks == tuple(range(ring.ranks[0], ring.ranks[0] + g)) and ring.ranks[0] % g == 0
    load = [0.0] * 8  # FLOPs per rank: within one short document of the balanced share (LPT)
    for r in ring.ranks:
        load[r] += doc_flops(2500, ctx.cost) / g
    for d in p.docs[1:]:
        load[d.owner] += doc_flops(d.length, ctx.cost)
    assert max(load) <= share + max(doc_flops(L, ctx.cost) for L in lengths[1:])
    assert min(load) >= share - max(doc_flops(L, ctx.cost) for L in lengths[1:])
    check_plan(p)


def test_hybrid_dp_groups_stay_inside_nodes_when_they_can():
    p = plan(long_tail(80, seed=5), strategy="hybrid_dp")
    for r in p.rings:
        assert r.size & (r.size - 1) == 0 and r.ranks[0] % r.size == 0
        assert (r.cls == "intra") == (r.size <= 4)


# --- dynamic_cp ---------------------------------------------------------------------------------
def test_dynamic_cp_group_sizes_follow_the_heuristic():
    lengths = long_tail(70, seed=7)
    ctx = toy_context(nodes=2, gpus=4, capacity=8000)
    for mslpr in (4000, 2000, 1000):
        pl = dynamic_cp_placement(lengths, ctx, mslpr)
        ring_of = {d: r for r in pl.rings for d in r.docs}
        for d in pl.docs:
            g = len(ring_of[d.doc].ranks) if d.ring >= 0 else 1
            need = gpus_needed(d.length, mslpr)
            assert g >= need and g & (g - 1) == 0  # fill_empty may double a group, never shrink it
        for r in pl.rings:
            assert r.ranks == tuple(range(r.ranks[0], r.ranks[0] + r.size))


def test_dynamic_cp_picks_the_fastest_mslpr():
    lengths = long_tail(60, seed=11)
    p = plan(lengths, strategy="dynamic_cp", capacity_tokens=4000)
    meta = dict(p.meta)
    preds = dict(x.split(":") for x in meta["max_seqlen_per_dp_cp_rank_predicted_s"].split(", "))
    assert meta["max_seqlen_per_dp_cp_rank"] in preds
    assert p.predicted_iteration_s == pytest.approx(min(float(v) for v in preds.values()), rel=1e-5)
    check_plan(p, 4000)


def test_member_tokens_match_zigzag_layout():
    for L in (1, 5, 16, 17, 1001):
        for g in (1, 2, 4, 8):
            assert sum(member_tokens(L, g)) == L and max(member_tokens(L, g)) - min(member_tokens(L, g)) <= 2


# --- every baseline ----------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=40),
       shape=st.sampled_from([(1, 4), (2, 2), (2, 4), (3, 4)]), strategy=st.sampled_from(BASELINES),
       tight=st.booleans())
def test_invariants_on_random_batches(lengths, shape, strategy, tight):
    world = shape[0] * shape[1]
    cap = 2 * -(-sum(lengths) // world)  # the default capacity, or a tight one (1.1x the mean)
    if tight:
        cap = max(max(lengths) // 4 + 2, -(-sum(lengths) // world) * 11 // 10 + 2)
    try:
        p = plan(lengths, *shape, strategy=strategy, capacity_tokens=cap)
    except PlanError as e:  # at a tight capacity a baseline's packing may not fit (its OOM in the bench):
        # e.g. hybrid_dp on [1, 304, 607, 716, 1129, 1129] over 3 x 4 ranks at 358 tokens, its groups
        # leave no rank 304 tokens of room; said so, naming the flag
        assert tight and "--zeppelin-capacity-tokens" in str(e), (strategy, lengths, cap, str(e))
        return
    check_plan(p, cap)
    for r in p.rings:
        assert r.cls == ("intra" if len({x // shape[1] for x in r.ranks}) == 1 else "inter")


@pytest.mark.parametrize("strategy", BASELINES)
def test_deterministic_and_order_free(strategy):
    lengths = sorted(set(long_tail(50, seed=13)))
    a, b = plan(lengths, strategy=strategy), plan(lengths, strategy=strategy)
    assert a.digest() == b.digest()
    shuffled = list(lengths)
    random.Random(1).shuffle(shuffled)
    c = plan(shuffled, strategy=strategy)  # distinct lengths: same decisions, relabelled documents
    assert c.predicted_iteration_s == pytest.approx(a.predicted_iteration_s, rel=1e-9)
    assert sorted(c.class_counts().items()) == sorted(a.class_counts().items())
