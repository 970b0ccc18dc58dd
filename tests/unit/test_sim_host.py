"""Host-CPU contention (sim/host.py), the HostModel that only the CPU validation passes in
(spec/host.py), and the CPU calibration's profile and host terms, on cases with known answers."""

from dataclasses import replace

import numpy as np
import pytest

from megatron_zeppelin.validation.concurrent import (CALL_LEN, CPU_MODEL, LAND_CHUNK, SEQLENS, SIZES, exchange_bytes,
                                                    profile_from)
from megatron_zeppelin.planner import plan_batch
from megatron_zeppelin.planner.cost.cost_model import BWD_FLOPS, CostModel
from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE
from megatron_zeppelin.spec.hardware import HardwareProfile, ProfileError, load_profile
from megatron_zeppelin.spec.host import HostError, HostModel, load_host
from megatron_zeppelin.sim.compute import LayerCosts
from megatron_zeppelin.sim.events import TaskGraph
from megatron_zeppelin.sim.host import shared_makespan
from megatron_zeppelin.sim.iteration import SimOptions, simulate, simulate_attention
from megatron_zeppelin.sim.network import LinkTable
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.validation.cpu_profile import CpuProfile


def _host(world, cores):
    """Capacities of ``world`` cores (1 each) and one host of ``cores``: resource r is rank r's core."""
    return np.array([1.0] * world + [float(cores)])


def test_four_equal_ranks_on_two_cores_take_twice_as_long():
    g = TaskGraph()
    ends = [g.work(1.0, (r, 4)) for r in range(4)]
    res = g.run(_host(4, 2))
    assert [res.end[e] for e in ends] == pytest.approx([2.0] * 4)


def test_one_rank_alone_runs_at_one_core():
    g = TaskGraph()
    e = g.work(1.0, (0, 4))
    assert g.run(_host(4, 2)).end[e] == pytest.approx(1.0)  # a rank is one thread: never more than a core


def test_ranks_up_to_the_core_count_do_not_slow_each_other():
    g = TaskGraph()
    for r in range(2):
        g.work(1.0, (r, 4))
    assert g.run(_host(4, 2)).makespan == pytest.approx(1.0)


def test_a_waiting_rank_takes_no_core():
    """One core: rank 0 computes 2 s; rank 1 waits 1 s (a message), then computes 1 s. Rank 0 runs
    alone for the first second, then both at half a core: 1 s of work left each, both end at 3 s."""
    g = TaskGraph()
    a = g.work(2.0, (0, 2))
    msg = g.delay(1.0)
    b = g.work(1.0, (1, 2), deps=[msg])
    res = g.run(_host(2, 1))
    assert res.end[a] == pytest.approx(3.0) and res.end[b] == pytest.approx(3.0)


def test_kernels_of_one_rank_stay_sequential_and_reshare_as_others_finish():
    g = TaskGraph()
    a1 = g.work(1.0, (0, 2))
    a2 = g.work(1.0, (0, 2), deps=[a1])
    b = g.work(0.5, (1, 2))
    res = g.run(_host(2, 1))
    # both at 1/2 until b is done at 1 s (rank 0 has done 0.5), then rank 0 alone: 1.5 s more
    assert res.end[b] == pytest.approx(1.0) and res.end[a1] == pytest.approx(1.5)
    assert res.end[a2] == pytest.approx(2.5)


def test_cpu_occupancy_is_what_the_ranks_are_charged():
    """Four 1 s ranks on 2 cores that deliver 1.6: 2.5 s, both cores busy throughout (5 core-seconds
    charged for 4 of work); then one rank that runs 1 s more alone adds 1 core-second."""
    g = TaskGraph()
    w = [g.work(1.0, (r, 4)) for r in range(4)]
    res = g.run(np.array([1.0, 1.0, 1.0, 1.0, 1.6]))
    assert res.makespan == pytest.approx(2.5)
    assert g.cpu_seconds() == pytest.approx(4.0)
    assert g.cpu_occupancy(res, cores=2) == pytest.approx(5.0)
    g.work(1.0, (0, 4), deps=[w[0]])
    res = g.run(np.array([1.0, 1.0, 1.0, 1.0, 1.6]))
    assert res.makespan == pytest.approx(3.5)
    assert g.cpu_occupancy(res, cores=2) == pytest.approx(6.0)


def test_link_table_cpu_resources():
    topo = Topology(1, 4)
    t = LinkTable(topo, 1e9, 1e9, host=HostModel(cores=2))
    core, host = t.cpu(3)
    assert t.keys[core] == ("core", 3) and t.keys[host] == ("host", 0)
    assert t.capacity[core] == 1.0 and t.capacity[host] == 2.0
    assert LinkTable(topo, 1e9, 1e9).cpu(3) is None
    assert t.keys[t.io(3)[0]] == ("io", 3) and t.io(3)[1] == host
    assert len(LinkTable(topo, 1e9, 1e9).capacity) == len(t.capacity) - 9  # 4 cores, 4 I/O threads, host
    assert LinkTable(topo, 1e9, 1e9, host=HostModel(post_us=100.0)).cpu(3) is None  # no cores: compute not shared


def _equal_plan(world):
    topo = Topology(1, world)
    return plan_batch([1000] * world, topo, TOY_PROFILE, TOY_MODEL, strategy="packed_dp")


@pytest.mark.parametrize("cores, factor", [(1, 4.0), (2, 2.0), (4, 1.0), (8, 1.0)])
def test_equal_ranks_attention_scales_with_ranks_per_core(cores, factor):
    plan = _equal_plan(4)
    alone = simulate_attention(plan, TOY_PROFILE, TOY_MODEL)
    shared = simulate_attention(plan, TOY_PROFILE, TOY_MODEL, host=HostModel(cores=cores))
    assert shared == pytest.approx(factor * alone, rel=1e-9)


def test_unequal_ranks_match_processor_sharing():
    """packed_dp (no messages): one layer's attention forward then backward per rank is one kernel
    chain, so the simulated time is the processor-sharing makespan of each rank's total."""
    topo = Topology(1, 4)
    plan = plan_batch([3000, 1500, 800, 400, 200, 100], topo, TOY_PROFILE, TOY_MODEL, strategy="packed_dp")
    k = LayerCosts(CostModel(TOY_MODEL, TOY_PROFILE, topo))
    work = [sum(k.block_fwd_s(d.length, d.length, True) + k.block_bwd_s(d.length, d.length, True)
                for d in plan.docs if d.owner == r) for r in range(4)]
    assert len(set(np.round(work, 12))) > 1  # a real imbalance
    for cores in (1, 2, 3):
        got = simulate_attention(plan, TOY_PROFILE, TOY_MODEL, host=HostModel(cores=cores))
        assert got == pytest.approx(shared_makespan(work, cores), rel=1e-9)
    assert simulate_attention(plan, TOY_PROFILE, TOY_MODEL) == pytest.approx(max(work), rel=1e-9)


def test_an_empty_host_leaves_results_unchanged():
    plan = plan_batch([6000, 3000, 900, 500, 300] * 2, Topology(2, 4, 2), TOY_PROFILE, TOY_MODEL)
    base = simulate(plan, TOY_PROFILE, TOY_MODEL)
    same = simulate(plan, TOY_PROFILE, TOY_MODEL, host=HostModel())
    assert same.iteration_s == base.iteration_s and same.rank_compute_s == base.rank_compute_s
    # and planned with it: the same plan (every host term 0 adds exactly 0)
    assert plan_batch(list(plan.lengths), plan.topology, TOY_PROFILE, TOY_MODEL, host=HostModel()) == plan
    # as many cores as ranks: nobody waits for a core, the same times (up to rounding of the rates)
    roomy = simulate(plan, TOY_PROFILE, TOY_MODEL, options=SimOptions(layers="all"), host=HostModel(cores=8))
    exact = simulate(plan, TOY_PROFILE, TOY_MODEL, options=SimOptions(layers="all"))
    assert roomy.iteration_s == pytest.approx(exact.iteration_s, rel=1e-9)
    assert roomy.link_bytes == pytest.approx(exact.link_bytes)
    # compute seconds per rank are a core's seconds either way; sharing only stretches the timeline
    tight = simulate(plan, TOY_PROFILE, TOY_MODEL, host=HostModel(cores=2))
    assert tight.iteration_s > base.iteration_s
    for a, b in zip(tight.rank_compute_s, base.rank_compute_s):
        assert a == pytest.approx(b)


def test_full_block_rates():
    """A profile whose full-block rate is twice its causal rate times a full L x L block like a
    causal one (torch's CPU flash kernel at <= 512 tokens); without the table, twice as long."""
    p = replace(TOY_PROFILE, attn_full_fwd_tflops=tuple(2 * x for x in TOY_PROFILE.attn_fwd_tflops),
                attn_full_bwd_tflops=tuple(2 * x for x in TOY_PROFILE.attn_bwd_tflops))
    topo = Topology(1, 2)
    plain, cpu = (LayerCosts(CostModel(TOY_MODEL, q, topo)) for q in (TOY_PROFILE, p))
    L = 1000
    assert plain.block_fwd_s(L, L, False) == pytest.approx(2 * plain.block_fwd_s(L, L, True), rel=2e-3)
    assert cpu.block_fwd_s(L, L, False) == pytest.approx(cpu.block_fwd_s(L, L, True), rel=2e-3)
    assert cpu.block_bwd_s(L, L, False) == pytest.approx(cpu.block_bwd_s(L, L, True), rel=2e-3)


def test_profile_and_host_round_trip_and_gpu_presets_carry_no_host(tmp_path):
    p = replace(TOY_PROFILE, attn_full_fwd_tflops=(30.0, 150.0), attn_full_bwd_tflops=(20.0, 90.0))
    host = HostModel(cores=2.0, copy_GBps=4.0, post_us=450.0, wait_us=170.0, land_GBps=3.5, pack_GBps=1.25,
                     split_fwd_us=30.0, split_row_bwd_us=0.3)
    path = tmp_path / "p.yaml"
    CpuProfile(p, host).save(str(path))
    assert load_profile(str(path)) == p  # the product reads the profile alone: the host: section is not its
    assert load_host(str(path)) == host and CpuProfile.load(str(path)) == (p, host)
    p.save(str(tmp_path / "plain.yaml"))
    assert load_host(str(tmp_path / "plain.yaml")) is None
    for name in ("a800", "h800", "h200"):  # GPU profiles: no host terms at all
        d = load_profile(name).to_dict()
        assert "host" not in d and not any(k.startswith("host_") for k in d)
        assert not any(k.startswith("split_") for k in d["attention"]) and "full_fwd_tflops" in d["attention"]
    assert not any(f.startswith(("host_", "attn_split")) for f in HardwareProfile.__dataclass_fields__)
    with pytest.raises(Exception, match="full_fwd_tflops"):
        replace(TOY_PROFILE, attn_full_fwd_tflops=(1.0,))
    for field in ("cores", "land_GBps", "pack_GBps", "split_row_fwd_us"):
        with pytest.raises(HostError, match=f"host.{field} must be >= 0"):
            HostModel(**{field: -1.0})
    with pytest.raises(HostError, match="unknown host: field"):
        HostModel.from_dict({"cores": 1.0, "post_s": 2.0})
    # a profile written before the host had its own section names where its terms went
    old = {**TOY_PROFILE.to_dict(), "host_cores": 2.0}
    with pytest.raises(ProfileError, match="host_cores belong to a CPU host.*host: section"):
        HardwareProfile.from_dict(old)


def _synthetic(rate_fwd, rate_bwd, full_fwd, full_bwd, seq_f, seq_b, cores):
    """What ``measure`` would report on a machine with these exact costs: causal blocks at
    ``rate_*``, full ones at ``full_*`` TFLOP/s, ``seq_*`` seconds per sequence (a query chunk with
    its key blocks) and 400 / 600 us per kernel call (forward / backward), every probe one call on
    the engine's path."""
    hd = CPU_MODEL.heads * CPU_MODEL.head_dim
    call_f, call_b = 4e-4, 6e-4
    out = {"cores": cores, "full_fwd": {}, "full_bwd": {}, "full_blocks": {}, "full_flops": {}, "local_fwd": {},
           "local_bwd": {}, "local_docs": {}, "local_flops": {}, "gemm": 2.0 * 1024 * CPU_MODEL.hidden * CPU_MODEL.ffn / 1e11,
           "p2p": {n: [1e-4 + n / 1e9, 9.0, 1e-4 + n / 1e9] for n in SIZES}}  # one round held up
    docs = 3
    for L in SEQLENS:
        c, f = 2.0 * L * (L + 1) * hd, 4.0 * L * L * hd
        full = (f / (full_fwd * 1e12), BWD_FLOPS * f / (full_bwd * 1e12))  # FLOPs time of one block
        causal = (c / (rate_fwd * 1e12), BWD_FLOPS * c / (rate_bwd * 1e12))
        # ring step 1: per document 2 full blocks, each its own sequence, all in one call, timed per block
        out["full_fwd"][L] = (call_f + 2 * docs * (seq_f + full[0])) / (2 * docs)
        out["full_bwd"][L] = (call_b + 2 * docs * (seq_b + full[1])) / (2 * docs)
        out["full_blocks"][L], out["full_flops"][L] = 2 * docs, f
        # local documents of L tokens in one call: one causal block, one sequence each
        out["local_docs"][L], out["local_flops"][L] = docs, c
        out["local_fwd"][L] = call_f + docs * (seq_f + causal[0])
        out["local_bwd"][L] = call_b + docs * (seq_b + causal[1])
    out["engine_seq"], out["engine_call"] = (seq_f, seq_b), (call_f, call_b)
    out["pack"] = 1.0 / 1.5e9  # packing own rows at 1.5 GB/s
    # the engine's CPU per Post (500 us) and per Wait (200 us + the message at 3 GB/s), one
    # repeat of each size held up by a busy moment (the median skips it); the transport copies at
    # 4 GB/s at each end (one repeat lost in noise)
    out["engine_exchange"] = {c: ([5e-4, 5e-4, 0.1], [2e-4 + exchange_bytes(c) / 3e9] * 2 + [0.1], [4e9, 4e9, 0.0])
                              for c in (CALL_LEN, LAND_CHUNK)}
    return out


def test_calibration_recovers_known_costs():
    res = [_synthetic(0.012, 0.018, 0.04, 0.05, 1.5e-4, 1.0e-4, 2)] * 2
    p, host = profile_from([res], 2)
    assert isinstance(p, HardwareProfile) and isinstance(host, HostModel) and host.cores == 2.0
    assert p.attn_seq_fwd_us == pytest.approx(150.0) and p.attn_seq_bwd_us == pytest.approx(100.0)
    assert p.attn_call_fwd_us == pytest.approx(400.0) and p.attn_call_bwd_us == pytest.approx(600.0)
    # 16 and 32 tokens: so few FLOPs that the rate is under the 5% floor of a block's time
    assert p.attn_full_fwd_tflops[2:] == pytest.approx([0.04] * (len(SEQLENS) - 2))
    assert p.attn_full_bwd_tflops[2:] == pytest.approx([0.05] * (len(SEQLENS) - 2))
    assert p.attn_fwd_tflops[2:] == pytest.approx([0.012] * (len(SEQLENS) - 2))
    assert p.attn_bwd_tflops[2:] == pytest.approx([0.018] * (len(SEQLENS) - 2))
    assert p.nvlink_GBps == pytest.approx(1.0) and p.nvlink_latency_us == pytest.approx(100.0)
    assert p.gemm_tflops == pytest.approx(0.1) and host.copy_GBps == pytest.approx(4.0)
    assert host.post_us == pytest.approx(500.0) and host.wait_us == pytest.approx(200.0)
    assert host.land_GBps == pytest.approx(3.0) and host.pack_GBps == pytest.approx(1.5)


def test_a_slow_sample_is_outvoted():
    """Three samples of the whole calibration (the validation's: before, mid-way, after its timed
    runs); in one, a slow minute of the machine makes every compute figure twice as slow and the
    host delivers half its cores. The median over ranks and samples is the other two's profile."""
    fast = [_synthetic(0.012, 0.018, 0.04, 0.05, 1.5e-4, 1.0e-4, 2)] * 2
    slow = [_synthetic(0.006, 0.009, 0.02, 0.025, 3.0e-4, 2.0e-4, 2)] * 2
    for res, rounds in ((fast, [1.0, 1.0]), (slow, [2.0, 2.0])):
        for r in res:
            r["sharing"] = (1.0, rounds)  # 2 s of work: in 1 s two cores, in 2 s one
    got, host = profile_from([fast, slow, fast], 2)
    assert replace(got, assumed=()) == replace(profile_from([fast, fast], 2).profile, assumed=())
    assert host == profile_from([fast, fast], 2).host and host.cores == 2.0
    assert profile_from([fast, slow, slow], 2).profile.attn_seq_fwd_us == pytest.approx(300.0)
    assert profile_from([slow, fast, slow], 2).host.cores == 1.0


def test_a_noisy_causal_probe_still_gives_a_valid_profile():
    """Local documents timed faster than their fixed costs allow (one noisy repeat): the causal block
    they imply would take no time; it is held to half a full block, and the profile stays valid."""
    res = [_synthetic(0.012, 0.018, 0.04, 0.05, 1.5e-4, 1.0e-4, 2) for _ in range(2)]
    for r in res:
        for L in SEQLENS[-3:]:
            r["local_fwd"][L] = r["engine_call"][0] + r["local_docs"][L] * 0.1 * r["full_fwd"][L]
    p = profile_from([res], 2).profile
    assert min(p.attn_fwd_tflops) > 0 and min(p.attn_bwd_tflops) > 0
    assert p.attn_bwd_tflops[2:] == pytest.approx([0.018] * (len(SEQLENS) - 2))  # the clean ones as before


def test_message_copies_take_host_cpu():
    """One core; rank 0 computes 1 s while rank 1 sends rank 2 a message whose copy takes 0.5 s of
    CPU at each end (the link itself is ~free). The compute and both copies share the core: the
    copies end at 1.5 s, the compute (0.5 s done by then) at 2 s. Without the copy cost: 1 s."""
    from megatron_zeppelin.sim.executor import Hop, run_step
    topo = Topology(1, 3)
    for copy, want_msg, want_compute in ((1e9, 1.5, 2.0), (0.0, 0.0, 1.0)):
        links = LinkTable(topo, 1e18, 1e18, host=HostModel(cores=1, copy_GBps=copy / 1e9))
        g = TaskGraph()
        c = g.work(1.0, links.cpu(0))
        ends = run_step(g, links, topo, [Hop("direct", 1, 2, 5e8, "nvlink", -1, "x")], {}, {"nvlink": 0.0, "nic": 0.0})
        res = g.run(links.capacity)
        assert res.end[ends[2]] == pytest.approx(want_msg, abs=1e-6)
        assert res.end[c] == pytest.approx(want_compute, abs=1e-6)
