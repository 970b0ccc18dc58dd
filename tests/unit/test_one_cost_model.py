"""One cost model: the partitioner, the prediction and the simulator price the same work the same
way on every kind of profile, not only on the toy one (a profile with full-block tables once had a
plan predicted at 2.16 ms and simulated at 7.77 ms: the prediction ignored those tables)."""

from dataclasses import replace

import numpy as np
import pytest

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.planner import make_context, plan_batch
from megatron_zeppelin.planner.build.assemble import assemble
from megatron_zeppelin.planner.baselines.static_cp import cp_placement
from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.planner.program import Post, attention_program
from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE
from megatron_zeppelin.sim.compute import LayerCosts
from megatron_zeppelin.sim.iteration import SimOptions, simulate
from megatron_zeppelin.spec.host import HostModel
from megatron_zeppelin.spec.topology import Topology

# Full blocks twice as fast per FLOP as the causal table at every length (a GPU flash kernel's
# causal tiles are half masked; the causal table pays for them).
FULL = replace(TOY_PROFILE, name="full", attn_full_fwd_tflops=(40.0, 200.0), attn_full_bwd_tflops=(32.0, 160.0))
# As `calibrate --device cpu` and the CPU validation write one: slow single-core rates that barely
# grow with length, full blocks faster than causal ones at short lengths (the CPU kernel does not
# skip masked tiles), fixed costs per kernel call and per sequence, a gloo-like link.
CPU_LIKE = replace(TOY_PROFILE, name="cpu", gemm_tflops=0.05, attn_seqlen=(16, 64, 256, 1024),
                   attn_fwd_tflops=(0.004, 0.012, 0.02, 0.025), attn_bwd_tflops=(0.003, 0.008, 0.015, 0.02),
                   attn_full_fwd_tflops=(0.008, 0.02, 0.025, 0.027),
                   attn_full_bwd_tflops=(0.006, 0.014, 0.018, 0.021),
                   attn_call_fwd_us=40.0, attn_call_bwd_us=90.0, attn_seq_fwd_us=8.0, attn_seq_bwd_us=15.0,
                   nvlink_GBps=1.0, nvlink_latency_us=60.0,
                   nic_GBps=1.0, nic_latency_us=60.0)
# Its ranks sharing one CPU, as the CPU validation passes it in (spec/host.py): the CPU kernel's
# split sequences, the engine's CPU per Post and Wait and packing its own rows.
CPU_HOST = HostModel(split_fwd_us=30.0, split_bwd_us=6.0, split_row_fwd_us=0.5, split_row_bwd_us=0.3,
                     post_us=120.0, wait_us=60.0, land_GBps=2.0, pack_GBps=1.5)
PROFILES = [(TOY_PROFILE, None), (FULL, None), (CPU_LIKE, CPU_HOST)]  # (profile, host)
IDS = ["toy", "full", "cpu+host"]


def _lengths(n, seed=0, hi=5000):
    rng = np.random.default_rng(seed)
    return [int(x) for x in np.clip(rng.lognormal(np.log(800), 1.0, n), 50, hi)]


@pytest.mark.parametrize("profile, host", PROFILES, ids=IDS)
def test_block_costs_are_the_simulators(profile, host):
    """The planner's block and ring-member costs are the simulator's kernels, summed."""
    topo = Topology(1, 4)
    cost, k = CostModel(TOY_MODEL, profile, topo, host=host), LayerCosts(CostModel(TOY_MODEL, profile, topo, host=host))
    for q, kv, causal in [(100, 100, True), (300, 200, False), (5000, 5000, False), (0, 10, False)]:
        sim = (k.block_fwd_s(q, kv, causal) + k.block_bwd_s(q, kv, causal)) * TOY_MODEL.layers
        assert cost.block_s(q, kv, causal) == pytest.approx(sim, rel=1e-12, abs=0)
        assert float(cost.block_s_np([q], [kv], causal)[0]) == pytest.approx(sim, rel=1e-12, abs=0)
    c = 3000 // 4
    member = (2 * (k.block_fwd_s(c, c, True) + k.block_bwd_s(c, c, True))
              + 3 * (k.block_fwd_s(c, c, False) + k.block_bwd_s(c, c, False))
              + 2 * (cost.call_s() + cost.call_s(True))) * TOY_MODEL.layers  # a kernel call per ring step
    assert cost.ring_member_attention_s(3000, 2) == pytest.approx(member, rel=1e-12)
    if profile.attn_full_fwd_tflops:  # the full-block table is read, not the causal one
        plain = CostModel(TOY_MODEL, replace(profile, attn_full_fwd_tflops=(), attn_full_bwd_tflops=()), topo, host=host)
        assert cost.block_fwd_s(500, 500, False) < plain.block_fwd_s(500, 500, False)
        assert cost.block_fwd_s(500, 500, True) == plain.block_fwd_s(500, 500, True)


@pytest.mark.parametrize("profile, host", PROFILES, ids=IDS)
def test_local_plans_predicted_exactly_with_the_allreduce(profile, host):
    """Local documents only: the prediction is the simulator's iteration (every layer chained),
    the DP all-reduce included as its own term."""
    topo = Topology(2, 2, 2)
    plan = plan_batch(_lengths(20, hi=3000), topo, profile, TOY_MODEL, strategy="packed_dp", host=host)
    res = simulate(plan, profile, TOY_MODEL, options=SimOptions(layers="all"), host=host)
    assert plan.allreduce_s == res.allreduce_s > 0
    assert res.iteration_s == pytest.approx(plan.predicted_with_allreduce_s, rel=1e-9)


def _ring_plan(lengths, topo, cp, profile, host=None):
    ctx = make_context(topo, profile, TOY_MODEL, ZeppelinConfig(gpus_per_node=topo.gpus_per_node),
                       total_tokens=sum(lengths), host=host)
    return assemble("static_cp", lengths, ctx, cp_placement(lengths, ctx, cp=cp, comm="p2p"))


@pytest.mark.parametrize("profile, host", PROFILES, ids=IDS)
def test_ring_plans_predicted_as_simulated(profile, host):
    """Zigzag rings whose blocks are mostly full ones: prediction and simulator agree (they time
    the same steps; the simulator's per-layer barrier is the only difference)."""
    topo = Topology(1, 4)
    plan = _ring_plan([6000, 3000, 800], topo, cp=4, profile=profile, host=host)
    res = simulate(plan, profile, TOY_MODEL, host=host)
    assert res.iteration_s == pytest.approx(plan.predicted_with_allreduce_s, rel=0.02)


@pytest.mark.parametrize("profile, host", PROFILES, ids=IDS)
def test_zeppelin_plans_predicted_as_simulated(profile, host):
    topo = Topology(2, 4, 2)
    plan = plan_batch(_lengths(40, seed=5, hi=12000), topo, profile, TOY_MODEL, strategy="zeppelin", host=host)
    res = simulate(plan, profile, TOY_MODEL, host=host)
    assert res.iteration_s == pytest.approx(plan.predicted_with_allreduce_s, rel=0.05)


RECOMPUTES = ["selective:core_attn", "selective:core_attn,mlp", "full"]


def _recompute(plan, rc, topo, profile, host, cp=None):
    """The same placement planned with activation recompute ``rc``."""
    cfg = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, recompute=rc)
    if cp is not None:
        ctx = make_context(topo, profile, TOY_MODEL, cfg, total_tokens=sum(plan.lengths), host=host)
        return assemble("static_cp", list(plan.lengths), ctx, cp_placement(list(plan.lengths), ctx, cp=cp, comm="p2p"))
    return plan_batch(list(plan.lengths), topo, profile, TOY_MODEL, cfg, strategy=plan.strategy, host=host)


@pytest.mark.parametrize("rc", RECOMPUTES)
@pytest.mark.parametrize("profile, host", PROFILES, ids=IDS)
def test_recompute_local_plans_predicted_exactly(profile, host, rc):
    """Recompute is in the layer program's backward, priced the same by the prediction and the
    simulator (every layer chained); a local document repeats no communication."""
    topo = Topology(2, 2, 2)
    base = plan_batch(_lengths(20, hi=3000), topo, profile, TOY_MODEL, strategy="packed_dp", host=host)
    plan = _recompute(base, rc, topo, profile, host)
    res = simulate(plan, profile, TOY_MODEL, options=SimOptions(layers="all"), host=host)
    assert res.iteration_s == pytest.approx(plan.predicted_with_allreduce_s, rel=1e-9)
    assert plan.predicted_iteration_s > base.predicted_iteration_s
    assert plan.lower_bound_s > base.lower_bound_s
    plain = simulate(base, profile, TOY_MODEL, options=SimOptions(layers="all"), host=host)
    recomputed = max(r.get("recompute", 0.0) for r in res.rank_compute_s)
    assert recomputed > 0 and res.link_bytes.get("nvlink", 0) >= plain.link_bytes.get("nvlink", 0)
    if rc.startswith("selective"):  # remaps are not repeated: the same bytes on the links
        assert res.link_bytes == plain.link_bytes


@pytest.mark.parametrize("rc", RECOMPUTES)
@pytest.mark.parametrize("profile, host", PROFILES, ids=IDS)
def test_recompute_ring_plans_predicted_as_simulated(profile, host, rc):
    """Recomputed ring attention repeats its forward K/V exchanges: one more forward's ring bytes
    per layer on the links, and the prediction still times what the simulator times."""
    topo = Topology(1, 4)
    base = _ring_plan([6000, 3000, 800], topo, cp=4, profile=profile, host=host)
    plan = _recompute(base, rc, topo, profile, host, cp=4)
    res, plain = simulate(plan, profile, TOY_MODEL, host=host), simulate(base, profile, TOY_MODEL, host=host)
    assert res.iteration_s == pytest.approx(plan.predicted_with_allreduce_s, rel=0.02)
    assert res.iteration_s > plain.iteration_s
    posts = [x for x in attention_program(base.rings, False, backward=False) if isinstance(x, Post)]
    fwd_ring = TOY_MODEL.layers * sum(o.nbytes for x in posts for o in base.ops(x.queue, x.step)
                                      if o.ring in x.rings)  # the forward's K/V, once per layer
    extra = res.link_bytes["nvlink"] - plain.link_bytes["nvlink"]
    if rc.startswith("selective"):
        assert extra == pytest.approx(fwd_ring, rel=1e-9)
    else:  # full: the remap's forward moves too (none here: CP plans keep their layout)
        assert extra >= fwd_ring * (1 - 1e-9)


@pytest.mark.parametrize("profile, host", PROFILES, ids=IDS)
def test_block_recompute_is_priced_per_layer(profile, host):
    """--recompute-method block --recompute-num-layers 1 of the toy model's 2 layers: the first layer
    reruns its forward, the second none. The prediction and the simulator (every layer chained, and
    one layer of each kind scaled) agree, and the price lies strictly between none and full: each
    half of full's extra, local plan and ring plan alike (a ring plan's recomputed layer repeats its
    K/V exchanges, the other does not)."""
    topo = Topology(2, 2, 2)
    for base in (plan_batch(_lengths(20, hi=3000), topo, profile, TOY_MODEL, strategy="packed_dp", host=host),
                 _ring_plan([6000, 3000, 800], Topology(1, 4), cp=4, profile=profile, host=host)):
        cp = 4 if base.strategy == "static_cp" else None
        t = base.topology
        none, block, full = (_recompute(base, rc, t, profile, host, cp) for rc in ("none", "full:block=1", "full"))
        assert dict(block.meta)["recompute"] == "full:block=1"
        assert none.predicted_iteration_s < block.predicted_iteration_s < full.predicted_iteration_s
        assert block.predicted_iteration_s == pytest.approx(
            (none.predicted_iteration_s + full.predicted_iteration_s) / 2, rel=1e-9)  # one layer of each
        assert none.lower_bound_s < block.lower_bound_s < full.lower_bound_s
        chained = simulate(block, profile, TOY_MODEL, options=SimOptions(layers="all"), host=host)
        scaled = simulate(block, profile, TOY_MODEL, host=host)
        rel = 1e-9 if cp is None else 0.02
        assert chained.iteration_s == pytest.approx(block.predicted_with_allreduce_s, rel=rel)
        assert scaled.iteration_s == pytest.approx(block.predicted_with_allreduce_s, rel=rel)
        assert 0 < scaled.recompute_s < simulate(full, profile, TOY_MODEL, host=host).recompute_s


def test_one_kernel_call_per_rank_per_compute():
    """The engine packs every block of a Compute into one kernel call per rank (attention/runner.py),
    so a Compute costs its blocks plus one call on each rank that has blocks, and the local queue one
    call on each rank owning local documents: counted here by hand from the blocks, not by the code
    that prices them."""
    from megatron_zeppelin.planner.program import AttentionWork, Compute, ring_step_blocks
    topo = Topology(2, 2)
    ctx = make_context(topo, CPU_LIKE, TOY_MODEL, ZeppelinConfig(gpus_per_node=2), total_tokens=13000, host=CPU_HOST)
    lengths = [9000, 3000, 700, 300]
    rings = assemble("static_cp", lengths, ctx, cp_placement(lengths, ctx, cp=2, comm="p2p"))
    local = plan_batch(lengths, topo, CPU_LIKE, TOY_MODEL, ZeppelinConfig(gpus_per_node=2), strategy="packed_dp",
                       host=CPU_HOST)
    free = CostModel(TOY_MODEL, replace(CPU_LIKE, attn_call_fwd_us=0.0, attn_call_bwd_us=0.0), topo, host=CPU_HOST)
    seen = {"ring": 0, "local": 0}
    for plan in (rings, local):
        paid, unpaid = AttentionWork(ctx.cost, plan.docs, plan.rings, 4), AttentionWork(free, plan.docs, plan.rings, 4)
        docs = {d.doc: d for d in plan.docs}
        owners = {d.owner for d in plan.docs if d.cls == "local"}
        for backward, call in ((False, 40e-6), (True, 90e-6)):
            for x in attention_program(plan.rings, has_local=bool(owners), backward=backward):
                if not isinstance(x, Compute):
                    continue
                if x.queue == "local":
                    busy = owners
                else:
                    busy = {r.ranks[i] for r in plan.rings if r.id in x.rings for s in x.steps
                            for i in range(r.size) if s < r.size and ring_step_blocks(r, docs, i, s)}
                seen["local" if x.queue == "local" else "ring"] += len(busy)
                want = [call if rank in busy else 0.0 for rank in range(4)]
                assert np.allclose(paid.seconds(x, backward) - unpaid.seconds(x, backward), want, rtol=0, atol=1e-12)
    assert seen["ring"] >= 8 and seen["local"] >= 4  # both kinds of Compute were checked


def test_split_sequences_priced_once_each():
    """A query chunk that sees full keys and then its own causal run in one call (ring step 0's
    later chunk; the CPU kernel runs it as two sequences and a merge) adds the profile's split cost
    once, with its rows: counted by hand from the zigzag chunks, not by the code that prices them."""
    from megatron_zeppelin.planner.program import AttentionWork, Compute
    topo = Topology(2, 2)
    ctx = make_context(topo, CPU_LIKE, TOY_MODEL, ZeppelinConfig(gpus_per_node=2), total_tokens=13000, host=CPU_HOST)
    lengths = [9000, 3000, 700, 300]
    plan = assemble("static_cp", lengths, ctx, cp_placement(lengths, ctx, cp=4, comm="p2p"))
    free = CostModel(TOY_MODEL, CPU_LIKE, topo, host=replace(CPU_HOST, split_fwd_us=0.0, split_bwd_us=0.0,
                                                             split_row_fwd_us=0.0, split_row_bwd_us=0.0))
    paid, unpaid = AttentionWork(ctx.cost, plan.docs, plan.rings, 4), AttentionWork(free, plan.docs, plan.rings, 4)
    docs = {d.doc: d for d in plan.docs}
    checked = 0
    for backward, fixed, row in ((False, 30e-6, 0.5e-6), (True, 6e-6, 0.3e-6)):
        for x in attention_program(plan.rings, has_local=False, backward=backward):
            if not isinstance(x, Compute):
                continue
            want = np.zeros(4)
            for r in plan.rings:
                if r.id not in x.rings or 0 not in x.steps:
                    continue
                g = r.size
                for i in range(g):
                    for d in r.docs:
                        b = docs[d].bounds
                        n = [b[c + 1] - b[c] for c in range(2 * g)]
                        late = 2 * g - 1 - i  # sees chunk i fully at step 0, then itself causally
                        if n[late] and n[i]:
                            want[r.ranks[i]] += fixed + row * n[late]
                            checked += 1
            assert np.allclose(paid.seconds(x, backward) - unpaid.seconds(x, backward), want, rtol=0, atol=1e-12)
    assert checked >= 8
