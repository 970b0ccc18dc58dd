"""The GPU cost terms (issue 53): each kernel call priced per sequence (its keys, its mask's table),
the full-block tables of the GPU presets, the launch and per-message overheads, and the SM
contention of overlapped NCCL exchanges; the prediction and the simulator read them alike."""

from dataclasses import replace

import numpy as np
import pytest

from megatron_zeppelin.attention.testing import hand_plan
from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.planner.cost.predict import _Attention, lower_bound, ring_costs
from megatron_zeppelin.planner.program import AttentionWork, Compute, attention_program, ring_step_blocks
from megatron_zeppelin.planner.testing import toy_context
from megatron_zeppelin.spec.hardware import HardwareProfile, load_profile
from megatron_zeppelin.spec.topology import Topology

from test_predict_backward import CASES, _sim_attention

GPUS = ("a800", "h100", "h200", "h800")


def _gpu_cost(topo: Topology, slowdown: float = 0.075) -> CostModel:
    """The toy model on a profile with every GPU term: full tables faster than causal, priced by
    sequence, a tile, launch and per-message overheads, SM contention."""
    p = replace(toy_context().profile, attn_seqlen=(128, 512, 4096), attn_fwd_tflops=(20.0, 50.0, 100.0),
                attn_bwd_tflops=(16.0, 40.0, 80.0), attn_full_fwd_tflops=(40.0, 80.0, 120.0),
                attn_full_bwd_tflops=(30.0, 60.0, 90.0), attn_by_sequence=True, attn_tile_tokens=128,
                attn_call_fwd_us=10.0, attn_call_bwd_us=20.0, message_us=5.0, overlap_slowdown=slowdown,
                gpus_per_node=topo.gpus_per_node, nics_per_node=max(1, topo.nics_per_node))
    return CostModel(toy_context().model, p, topo)


@pytest.mark.parametrize("name", GPUS)
def test_gpu_presets_state_every_term(name):
    p = load_profile(name)
    assert p.attn_by_sequence and p.attn_tile_tokens == 128
    assert len(p.attn_full_fwd_tflops) == len(p.attn_full_bwd_tflops) == len(p.attn_seqlen)
    # FlashAttention-2: a full block is never slower than a causal one of the same length
    assert all(f >= c for f, c in zip(p.attn_full_fwd_tflops, p.attn_fwd_tflops))
    assert all(f >= c for f, c in zip(p.attn_full_bwd_tflops, p.attn_bwd_tflops))
    for table in (p.attn_fwd_tflops, p.attn_bwd_tflops, p.attn_full_fwd_tflops, p.attn_full_bwd_tflops):
        assert list(table) == sorted(table)  # the lower bound reads them as growing with length
    assert p.attn_call_fwd_us > 0 and p.attn_call_bwd_us > 0 and p.message_us > 0 and 0 < p.overlap_slowdown < 0.2
    assert {"attention.call_fwd_us", "attention.call_bwd_us", "message_us", "overlap_slowdown"} <= set(p.assumed)
    assert HardwareProfile.from_dict(p.to_dict()) == p  # the YAML keeps every term


def test_a_call_prices_each_sequence_at_its_keys_and_mask():
    """A zigzag member's later chunk at a step past its own attends two full c x c blocks: one
    sequence of 2c keys at the full table's rate at 2c, not two blocks at the causal rate at c."""
    topo = Topology(1, 2)
    cost = _gpu_cost(topo)
    plan = hand_plan([4096], topo, [(0, 1)])
    work = AttentionWork(cost, plan.docs, plan.rings, 2)
    docs = {d.doc: d for d in plan.docs}
    blocks = ring_step_blocks(plan.rings[0], docs, member=0, step=1)
    assert [b[2] for b in blocks] == [False, False]  # two full blocks of the same query chunk
    q = blocks[0][0]
    flops = sum(float(cost.block_flops(a, k, c)) for a, k, c in blocks)
    expect = flops / float(cost.attn_rate(2 * q, False)) + cost.call_s()
    got = work.seconds(Compute("intra", (0,), (1,)), False)[0]
    assert got == pytest.approx(expect, rel=1e-12)
    per_block = sum(float(cost.block_flops(a, k, c)) / float(cost.attn_rate(a, True)) for a, k, c in blocks)
    assert got - cost.call_s() < per_block  # the causal table per block priced it slower


def test_below_the_tile_the_rate_falls_with_the_keys():
    cost = _gpu_cost(Topology(1, 2))
    assert float(cost.attn_rate(64, True)) == pytest.approx(float(cost.attn_rate(128, True)) / 2)
    clamped = replace(cost, profile=replace(cost.profile, attn_tile_tokens=0))
    assert float(clamped.attn_rate(64, True)) == float(clamped.attn_rate(128, True))


def test_message_overhead_on_every_hop_not_on_collectives():
    cost = _gpu_cost(Topology(2, 2, 1))
    assert cost.latency("nic") == pytest.approx((15.0 + 5.0) * 1e-6)
    assert cost.link_latency("nic") == pytest.approx(15.0e-6)
    bare = replace(cost, profile=replace(cost.profile, message_us=0.0))
    assert cost.dp_allreduce_s() == bare.dp_allreduce_s()  # NCCL's collectives: the link latency alone


def test_overlapped_compute_runs_slower_on_the_exchange_ranks():
    """The local document of rank 2 runs inside the intra ring's first K/V exchange (ranks 0, 1):
    rank 2 computes at full speed, the ring members' step 0 pays f x min(compute, transfer)."""
    topo = Topology(1, 4)
    cost = _gpu_cost(topo)
    free = replace(cost, profile=replace(cost.profile, overlap_slowdown=0.0))
    plan = hand_plan([8192, 3000], topo, [(0, 1), 2])
    slow, fast = (AttentionWork(c, plan.docs, plan.rings, 4, schedule=plan.schedule) for c in (cost, free))
    step0, local = Compute("intra", (0,), (0,)), Compute("local")
    T = cost.latency("nvlink") + plan.schedule[0].nbytes / cost.bandwidth("nvlink")  # each member's K/V, alone
    c = fast.seconds(step0, False)[:2]
    assert slow.seconds(step0, False)[:2] == pytest.approx(c + 0.075 * np.minimum(c, T), rel=1e-12)
    assert (slow.seconds(step0, False)[:2] > c).all()
    assert slow.seconds(local, False)[2] == fast.seconds(local, False)[2]  # rank 2 sends and receives nothing
    prog = attention_program(plan.rings, True, False)
    last = [x for x in prog if isinstance(x, Compute) and x.steps == (1,)][0]  # nothing in flight any more
    assert np.array_equal(slow.seconds(last, False), fast.seconds(last, False))


# Where a transfer is exposed the prediction, which times one exchange at a time with the exchanges
# the program says share its links, and the simulator's fair sharing may differ a little: allgather's
# gather over the NIC is exposed once the full-block tables make its compute short, and so is
# a2a+p2p's ring of groups beside a local document (two of its messages share one NIC but leave
# at different times: the prediction charges them as leaving together, 0.8% here).
LOOSE = {"allgather": 1e-2, "a2a_p2p_inter_local": 1e-2}


@pytest.mark.parametrize("name", sorted(CASES))
def test_prediction_and_simulator_agree_with_gpu_terms(name):
    lengths, where, comm = CASES[name]
    topo = Topology(2, 2, 1) if any(isinstance(w, tuple) and (0 in w and 2 in w) for w in where) else Topology(1, 4)
    cost = _gpu_cost(topo)
    plan = hand_plan(lengths, topo, where, comm=comm, a2a=2 if comm == "a2a+p2p" else 1)
    att = _Attention(plan.docs, plan.rings, plan.schedule, cost)
    clock, busy = np.zeros(plan.world_size), np.zeros(plan.world_size)
    att.run(clock, True, busy)
    rel = LOOSE.get(name, 1e-9)
    assert clock.max() == pytest.approx(_sim_attention(plan, cost, True), rel=rel)
    a, e = ring_costs(plan.docs, plan.rings, plan.schedule, cost)
    fwd_bwd = (np.array(a) + np.array(e)).max() / cost.model.layers
    assert fwd_bwd == pytest.approx(_sim_attention(plan, cost, False) + _sim_attention(plan, cost, True), rel=rel)


def test_lower_bound_holds_where_full_blocks_run_faster():
    """A split document's full blocks run faster than the whole causal one: the lower bound counts
    every document at its faster table, so the attention of a ring split stays above it."""
    topo = Topology(1, 4)
    cost = _gpu_cost(topo, slowdown=0.0)
    cost = replace(cost, profile=replace(cost.profile, attn_call_fwd_us=0.0, attn_call_bwd_us=0.0))
    L = 65536
    plan = hand_plan([L], topo, [(0, 1, 2, 3)])
    a, _ = ring_costs(plan.docs, plan.rings, plan.schedule, cost)
    assert sum(a) < float(cost.doc_attention_s(L))  # the split is cheaper than the whole causal document
    assert lower_bound([L], cost) * 4 <= sum(a) + cost.linear_s(L)
    causal_only = replace(cost, profile=replace(cost.profile, attn_full_fwd_tflops=(), attn_full_bwd_tflops=()))
    assert lower_bound([L], causal_only) > lower_bound([L], cost)  # what the bound counted before


def test_bench_turns_each_term_off(tmp_path):
    """benchmarks/bench_gpu_terms.py: each variant's profile has its term off, the rest as the preset;
    "none" has every term at the value of a profile that states none of them."""
    from bench_scripts import load_bench
    bench = load_bench("bench_gpu_terms")
    p = load_profile("a800")
    off = load_profile(bench._profile_path("a800", "contention", str(tmp_path)))
    assert off.overlap_slowdown == 0 and off.message_us == p.message_us and off.attn_by_sequence
    none = load_profile(bench._profile_path("a800", "none", str(tmp_path)))
    bare = HardwareProfile(**{f: getattr(none, f) for f in ("name", "gpu", "gemm_tflops", "attn_seqlen",
                              "attn_fwd_tflops", "attn_bwd_tflops", "nvlink_GBps", "nvlink_latency_us",
                              "nic_GBps", "nic_latency_us", "gpus_per_node", "nics_per_node", "gpu_to_nic",
                              "memory_GB", "assumed")})
    assert none == bare
    assert bench._profile_path("a800", "all", str(tmp_path)) == "a800"
