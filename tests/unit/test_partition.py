"""The Zeppelin partitioner: thresholds from crossovers, classes, rings, capacity, determinism,
JSON and digest, and the issue-2 targets on the paper's workloads."""

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner import Plan, PlanError, plan_batch
from megatron_zeppelin.planner.build.checks import check_plan
from megatron_zeppelin.planner.partitioner.partition import plan_zeppelin
from megatron_zeppelin.spec.words import CLASSES
from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE, toy_context
from megatron_zeppelin.planner.partitioner.thresholds import inter_share, zeppelin_thresholds
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.topology import Topology


from megatron_zeppelin.planner.testing import rank_signature  # noqa: E402


def test_thresholds_follow_the_crossovers_not_constants():
    ctx = toy_context(nodes=2, gpus=4)
    th = zeppelin_thresholds(ctx)
    assert th.local_max == ctx.cost.crossover_length(2, "nvlink") - 1
    assert th.intra_max == ctx.cost.crossover_length(2, "nic", share=inter_share(ctx)) - 1
    faster = replace(TOY_PROFILE, nvlink_GBps=TOY_PROFILE.nvlink_GBps * 4, nic_GBps=TOY_PROFILE.nic_GBps * 4)
    ctx2 = replace(ctx, profile=faster, cost=replace(ctx.cost, profile=faster))
    th2 = zeppelin_thresholds(ctx2)
    assert th2.local_max < th.local_max  # faster NVLink: shorter documents already hide
    assert th2.intra_max < th.intra_max  # faster NICs: shorter documents may span nodes
    assert "NVLink" in th.reason and "span nodes" in th.reason


def test_classes_respect_the_length_ranges_and_rings_are_well_formed():
    rng = np.random.default_rng(0)
    lengths = [int(x) for x in rng.lognormal(7.5, 1.3, 120).clip(1, 60000)] + [120000]
    plan = plan_batch(lengths, Topology(2, 4), TOY_PROFILE, TOY_MODEL)
    check_plan(plan)
    th = plan.thresholds
    for d in plan.docs:  # a class is allowed from its range up: short documents never split
        lowest = "local" if d.length <= th.local_max else "intra" if d.length <= th.intra_max else "inter"
        assert CLASSES.index(d.cls) >= CLASSES.index(lowest), (d, th)
    assert plan.class_counts()["local"] >= 1
    # The crossover variant uses all three classes (the honest prediction may prefer another variant:
    # a routed inter ring couples its proxies to its steps).
    from megatron_zeppelin.planner import make_context
    from megatron_zeppelin.planner.build.assemble import assemble
    from megatron_zeppelin.planner.partitioner.partition import _plan_variant
    ctx = make_context(Topology(2, 4), TOY_PROFILE, TOY_MODEL, total_tokens=sum(lengths))
    hide = assemble("zeppelin", lengths, ctx, _plan_variant(lengths, ctx, "all", "hide", "time"))
    check_plan(hide)
    counts = hide.class_counts()
    assert counts["inter"] >= 1 and counts["intra"] >= 1 and counts["local"] >= 1
    assert plan.predicted_iteration_s <= hide.predicted_iteration_s
    for ring in plan.rings + hide.rings:
        if ring.cls == "inter":  # members grouped node by node: one NIC hop per node per step
            nodes = [plan.topology.node_of(r) for r in ring.ranks]
            assert nodes == sorted(nodes)
    assert float(dict(plan.meta)["budget_s"]) > 0


def test_placement_flags_follow_the_config():
    ctx = toy_context(nodes=2, gpus=2, config=ZeppelinConfig(gpus_per_node=2, remap=False, routing="off"))
    p = plan_zeppelin([5000, 300, 200], ctx)
    assert (p.remap, p.routing) == (False, False)
    # p2p shapes only: an a2a (Ulysses) shape, unrouted, would otherwise win this batch
    p = plan_zeppelin([5000, 300, 200], toy_context(nodes=2, gpus=2, config=ZeppelinConfig(gpus_per_node=2,
                                                                                            cp_comm="p2p")))
    assert (p.remap, p.routing) == (True, True)


def test_one_gpu_per_node_and_one_rank():
    plan = plan_batch([9000, 50000, 10, 7], Topology(3, 1), TOY_PROFILE, TOY_MODEL)
    check_plan(plan)
    assert plan.class_counts()["intra"] == 0
    plan = plan_batch([9000, 10], Topology(1, 1), TOY_PROFILE, TOY_MODEL)
    check_plan(plan)
    assert plan.class_counts() == {"inter": 0, "intra": 0, "local": 2}


def test_capacity_is_respected_or_named():
    cfg = ZeppelinConfig(gpus_per_node=4, capacity_tokens=4500)
    lengths = [8000, 2500, 2500, 900, 800, 700, 100]
    plan = plan_batch(lengths, Topology(1, 4), TOY_PROFILE, TOY_MODEL, cfg)
    check_plan(plan, capacity=4500)
    assert max(plan.tokens(r) for r in range(4)) <= 4500
    with pytest.raises(PlanError, match="--zeppelin-capacity-tokens"):
        plan_batch([11000, 1000], Topology(1, 4), TOY_PROFILE, TOY_MODEL, cfg.with_(capacity_tokens=2700))


def test_same_plan_for_any_order_of_the_lengths():
    rng = np.random.default_rng(1)
    lengths = [int(x) for x in rng.lognormal(7.0, 1.2, 60).clip(1, 40000)] + [777] * 5 + [5000] * 3
    base = plan_batch(lengths, Topology(2, 4), TOY_PROFILE, TOY_MODEL)
    for seed in range(3):
        perm = np.random.default_rng(seed).permutation(len(lengths))
        other = plan_batch([lengths[i] for i in perm], Topology(2, 4), TOY_PROFILE, TOY_MODEL)
        assert rank_signature(other) == rank_signature(base)
        for a, b in zip(base.cost, other.cost):
            assert a.total_s == pytest.approx(b.total_s, rel=1e-12)
        assert other.thresholds == base.thresholds


def test_json_round_trip_and_digest_stable_across_processes():
    lengths = [12000, 5000, 4000, 300, 200, 100, 90000]
    plan = plan_batch(lengths, Topology(2, 4), TOY_PROFILE, TOY_MODEL)
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.digest() == plan.digest()
    assert plan.first_difference(again) is None
    code = ("from megatron_zeppelin.planner import plan_batch\n"
            "from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE\n"
            "from megatron_zeppelin.spec.topology import Topology\n"
            f"print(plan_batch({lengths!r}, Topology(2, 4), TOY_PROFILE, TOY_MODEL).digest())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert out.stdout.strip() == plan.digest()


def _issue_targets(ds: str, seed: int):
    """Issue 2's setting: 4 nodes x 8 A800, llama-7b, ~1M tokens, 64K context. Zeppelin's plan is
    valid, within 5% of the mean per rank, within 1.15x of the lower bound, and predicts a faster
    iteration than every baseline at its best settings."""
    from megatron_zeppelin.spec.config import STRATEGIES
    from megatron_zeppelin.data.workloads import sample_batch
    prof, model = load_profile("a800"), load_model("llama-7b")
    topo = Topology(4, 8, prof.nics_per_node, prof.gpu_to_nic)
    lengths = sample_batch(ds, 1 << 20, seed=seed, max_len=65536)
    z = plan_batch(lengths, topo, prof, model, strategy="zeppelin")
    check_plan(z)
    assert z.imbalance <= 1.05, (ds, seed, z.imbalance)
    assert z.predicted_iteration_s / z.lower_bound_s <= 1.15, (ds, seed)
    for base in STRATEGIES[1:]:
        b = plan_batch(lengths, topo, prof, model, strategy=base)
        assert z.predicted_iteration_s < b.predicted_iteration_s, (ds, seed, base)


@pytest.mark.parametrize("ds", ["arxiv", "github", "prolong64k"])
def test_paper_workloads_meet_the_issue_targets(ds):
    _issue_targets(ds, 0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("ds", ["arxiv", "github", "prolong64k"])
def test_paper_workloads_meet_the_issue_targets_more_seeds(ds, seed):
    _issue_targets(ds, seed)


def test_long_documents_span_nodes_on_small_rings():
    """Node-granular placement cannot balance 3 long documents over 2 nodes; with documents
    spanning nodes on small inter rings (members node by node, steps that hide the routed
    transfer), the plan is valid and no rank's attention exceeds its node's level."""
    lengths = [40000] * 3 + [300] * 20
    plan = plan_batch(lengths, Topology(2, 4), TOY_PROFILE, TOY_MODEL)
    check_plan(plan)
    inter = [r for r in plan.rings if r.cls == "inter"]
    if "shape" not in dict(plan.meta):  # Zeppelin's own greedy (not a baseline's shape it also weighs)
        assert inter and all(r.size < plan.world_size for r in inter)
    for r in inter:
        nodes = [plan.topology.node_of(x) for x in r.ranks]
        assert nodes == sorted(nodes) and len(set(nodes)) == 2
    # Under the honest prediction (ring partners and proxies wait for each other, dK/dV exposed):
    # 8.27 ms against static_cp's 8.67 ms (CP 2), the closest baseline.
    for base in ("static_cp", "hybrid_dp", "dynamic_cp"):
        other = plan_batch(lengths, Topology(2, 4), TOY_PROFILE, TOY_MODEL, strategy=base)
        assert plan.predicted_iteration_s <= other.predicted_iteration_s, base


def test_linear_layout_balances_time_inside_each_node_over_nvlink_only():
    from megatron_zeppelin.data.workloads import sample_batch
    prof, model = load_profile("a800"), load_model("llama-7b")
    topo = Topology(2, 8, prof.nics_per_node, prof.gpu_to_nic)
    plan = plan_batch(sample_batch("prolong64k", 1 << 19, seed=3, max_len=65536), topo, prof, model)
    check_plan(plan)
    assert all(topo.same_node(m.src, m.dst) for m in plan.remap)  # node totals kept
    for v in range(topo.nodes):  # finishing times (they include waiting for partners): 1.024 measured
        t = [plan.cost[r].total_s for r in topo.node_ranks(v)]
        assert max(t) / min(t) < 1.03
    assert max(c.remap_s for c in plan.cost) < 0.02 * plan.predicted_iteration_s


def test_shapes_still_weighed_where_the_greedy_finds_no_room():
    # Tight capacity (3000 tokens a rank, 11.5K of 12K used): the greedy's free-ring passes cannot
    # seat the last document, but a fixed shape holding every document on a2a groups of 2 can. The
    # partitioner's error no longer ends the search; it is raised only where nothing fits.
    lengths = [3257, 4134, 2549, 1603]
    ctx = toy_context(capacity=3000)
    with pytest.raises(PlanError, match="fits no ranks with room"):
        from megatron_zeppelin.planner.partitioner.partition import _choose
        _choose(lengths, ctx, "all", "hide", "free")
    plan = plan_batch(lengths, ctx.topology, TOY_PROFILE, TOY_MODEL,
                      ZeppelinConfig(gpus_per_node=4, capacity_tokens=3000), strategy="zeppelin")
    check_plan(plan, capacity=3000)  # every rank's layouts within the capacity
    from megatron_zeppelin.errors import ZeppelinError
    with pytest.raises(ZeppelinError, match="zeppelin-capacity-tokens"):  # nothing fits: the error names the flag
        plan_batch(lengths, ctx.topology, TOY_PROFILE, TOY_MODEL,
                   ZeppelinConfig(gpus_per_node=4, capacity_tokens=2800), strategy="zeppelin")


def test_a_remap_that_cannot_fit_skips_its_variant_only():
    # A round of 12 documents filling 99.7% of 32 a800 ranks' capacity (4561 tokens each, as
    # dynamic_cp's scheduler packs a round): the time-balanced remap's linear layout cannot hold the
    # batch (RemapError), which used to end the search; the variants without a remap still fit.
    from megatron_zeppelin.spec.hardware import load_profile
    lengths = [2607, 1352, 1172, 13847, 13255, 3088, 18545, 15652, 21721, 18163, 14777, 21364]
    prof = load_profile("a800")
    topo = Topology(4, 8, prof.nics_per_node, prof.gpu_to_nic)
    config = ZeppelinConfig(gpus_per_node=8, capacity_tokens=4561, cluster="a800")
    plan = plan_batch(lengths, topo, prof, load_model("llama-7b"), config, strategy="zeppelin")
    check_plan(plan, capacity=4561)
