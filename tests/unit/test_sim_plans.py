"""The simulator on whole Plans: agreement with the planner's prediction where the two models must
agree, overlap, routing, the strategy-blindness of the simulator."""

from dataclasses import replace

import numpy as np
import pytest

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.planner import make_context, plan_batch
from megatron_zeppelin.planner.build.assemble import assemble
from megatron_zeppelin.planner.baselines.static_cp import cp_placement
from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE
from megatron_zeppelin.sim.iteration import SimOptions, simulate
from megatron_zeppelin.spec.topology import Topology

NO_AR = SimOptions(allreduce=False)


def _lengths(n, seed=0, hi=5000):
    rng = np.random.default_rng(seed)
    return [int(x) for x in np.clip(rng.lognormal(np.log(800), 1.0, n), 50, hi)]


def test_one_rank_equals_prediction():
    topo = Topology(1, 1)
    plan = plan_batch([300, 1000, 40], topo, TOY_PROFILE, TOY_MODEL, strategy="packed_dp")
    for mode in ("scale", "all"):
        res = simulate(plan, TOY_PROFILE, TOY_MODEL, options=SimOptions(layers=mode))
        assert res.iteration_s == pytest.approx(plan.predicted_iteration_s, rel=1e-12)
        assert res.allreduce_s == 0.0


def test_packed_dp_equals_prediction_without_allreduce():
    topo = Topology(2, 4, 2)
    plan = plan_batch(_lengths(40), topo, TOY_PROFILE, TOY_MODEL, strategy="packed_dp")
    exact = simulate(plan, TOY_PROFILE, TOY_MODEL, options=SimOptions(layers="all", allreduce=False))
    assert exact.iteration_s == pytest.approx(plan.predicted_iteration_s, rel=1e-12)
    scaled = simulate(plan, TOY_PROFILE, TOY_MODEL, options=NO_AR)  # barrier per layer: an upper bound
    assert plan.predicted_iteration_s <= scaled.iteration_s <= 1.01 * plan.predicted_iteration_s


def _ring_plan(lengths, topo, cp, routing=False, profile=TOY_PROFILE):
    ctx = make_context(topo, profile, TOY_MODEL, ZeppelinConfig(gpus_per_node=topo.gpus_per_node),
                       total_tokens=sum(lengths))
    placement = cp_placement(lengths, ctx, cp=cp, comm="p2p")
    placement.routing = routing
    return assemble("static_cp", lengths, ctx, placement)


def test_perfect_overlap_ring_hides_its_transfers():
    """One long document on a 2-rank NVLink ring: compute per step far exceeds the K/V transfer, so
    the forward takes as long as with infinitely fast links."""
    topo = Topology(1, 2)
    plan = _ring_plan([200_000], topo, cp=2)
    fast = replace(TOY_PROFILE, nvlink_GBps=1e9, nvlink_latency_us=0.0)
    slow = simulate(plan, TOY_PROFILE, TOY_MODEL, options=NO_AR)
    ideal = simulate(plan, fast, TOY_MODEL, options=NO_AR)
    assert slow.forward_s == pytest.approx(ideal.forward_s, rel=1e-9)
    # the backward's last step (finished dK/dV home) cannot hide: it is the only difference
    assert slow.backward_s > ideal.backward_s
    # and the prediction (which overlaps every step) agrees within that exposed step
    assert slow.iteration_s == pytest.approx(plan.predicted_iteration_s, rel=0.02)


def test_exposed_transfer_when_the_link_is_slow():
    topo = Topology(1, 2)
    plan = _ring_plan([4000], topo, cp=2)
    slow = replace(TOY_PROFILE, nvlink_GBps=0.001)
    fast = simulate(plan, TOY_PROFILE, TOY_MODEL, options=NO_AR)
    crawl = simulate(plan, slow, TOY_MODEL, options=NO_AR)
    kv = plan.kv_bytes_per_token * 2000  # one member's block
    # forward: step 0 moves one block per direction (exposed); backward: 2x at step 0, 1x at step 1
    assert crawl.iteration_s - fast.iteration_s == pytest.approx(
        TOY_MODEL.layers * 4 * kv / 1e6, rel=0.05)


def test_routing_speeds_up_an_inter_node_ring():
    topo = Topology(2, 4, 4)
    lengths = [40_000]
    direct = _ring_plan(lengths, topo, cp=8)
    routed = _ring_plan(lengths, topo, cp=8, routing=True)
    slow_nic = replace(TOY_PROFILE, nic_GBps=0.5)  # make the ring communication-bound
    t_direct = simulate(direct, slow_nic, TOY_MODEL, options=NO_AR)
    t_routed = simulate(routed, slow_nic, TOY_MODEL, options=NO_AR)
    if not any(o.stage != "direct" for o in routed.schedule):
        pytest.skip("routing layer not landed (route_schedule passes ops through)")
    assert t_routed.iteration_s < t_direct.iteration_s
    used = [n for n in t_routed.nic if n["bytes_out"] > 0]
    assert len(used) > len([n for n in t_direct.nic if n["bytes_out"] > 0])


def test_simulator_is_blind_to_the_strategy_name_and_scale_tracks_all_layers():
    topo = Topology(2, 4, 2)
    plan = plan_batch(_lengths(60, seed=3, hi=20000), topo, TOY_PROFILE, TOY_MODEL, strategy="zeppelin")
    a = simulate(plan, TOY_PROFILE, TOY_MODEL)
    b = simulate(replace(plan, strategy="something_else"), TOY_PROFILE, TOY_MODEL)
    assert a.iteration_s == b.iteration_s
    full = simulate(plan, TOY_PROFILE, TOY_MODEL, options=SimOptions(layers="all"))
    assert full.iteration_s <= a.iteration_s * (1 + 1e-9)
    assert a.iteration_s <= 1.10 * full.iteration_s


def test_overlapped_grad_reduce_hides_part_of_the_allreduce():
    topo = Topology(2, 4, 2)
    plan = plan_batch(_lengths(40), topo, TOY_PROFILE, TOY_MODEL, strategy="packed_dp")
    plain = simulate(plan, TOY_PROFILE, TOY_MODEL)
    over = simulate(plan, TOY_PROFILE, TOY_MODEL, options=SimOptions(overlap_grad_reduce=True))
    assert plain.allreduce_exposed_s == plain.allreduce_s > 0
    assert over.allreduce_exposed_s < plain.allreduce_exposed_s
    assert over.iteration_s < plain.iteration_s


def test_without_the_timeline_every_number_is_the_same():
    """The bench simulates with ``timeline=False`` (its matrix reads no timeline; the report simulates
    its Gantt cases again): only the timeline goes."""
    topo = Topology(2, 2)
    plan = plan_batch([9000, 3000, 1200, 800, 500], topo, TOY_PROFILE, TOY_MODEL, ZeppelinConfig(gpus_per_node=2))
    full = simulate(plan, TOY_PROFILE, TOY_MODEL)
    bare = simulate(plan, TOY_PROFILE, TOY_MODEL, options=SimOptions(timeline=False))
    assert full.timeline and not bare.timeline
    assert replace(full, timeline=[]) == bare
