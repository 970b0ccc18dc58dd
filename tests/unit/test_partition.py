"""The Zeppelin partitioner: thresholds from crossovers, classes, rings, capacity, determinism,
JSON and digest, and the issue-2 targets on the paper's workloads."""

import json
import subprocess
import sys
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from megatron_zeppelin.config import ZeppelinConfig
from megatron_zeppelin.model_spec import load_model
from megatron_zeppelin.planner import Plan, PlanError, plan_batch
from megatron_zeppelin.planner.checks import check_plan
from megatron_zeppelin.planner.partition import plan_zeppelin
from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE, toy_context
from megatron_zeppelin.planner.thresholds import zeppelin_thresholds
from megatron_zeppelin.profile import load_profile
from megatron_zeppelin.topology import Topology


def rank_signature(plan: Plan):
    """Per rank: multiset of (class, ring ranks, length) of what it holds (order-free)."""
    out = []
    for r in range(plan.world_size):
        items = [("local", (), d.length) for d in plan.local_docs(r)]
        for ring in plan.rings_of(r):
            items += [(ring.cls, ring.ranks, plan.docs[d].length) for d in ring.docs]
        out.append(Counter(items))
    return out


def test_thresholds_follow_the_crossovers_not_constants():
    ctx = toy_context(nodes=2, gpus=4)
    th = zeppelin_thresholds(ctx, granule_s=1e-3)
    assert th.local_max == ctx.cost.crossover_length(2, "nvlink") - 1
    faster = replace(TOY_PROFILE, nvlink_GBps=TOY_PROFILE.nvlink_GBps * 4)
    ctx2 = replace(ctx, profile=faster, cost=replace(ctx.cost, profile=faster))
    th2 = zeppelin_thresholds(ctx2, granule_s=1e-3)
    assert th2.local_max < th.local_max  # faster NVLink: shorter documents already hide
    assert "NVLink" in th.reason and "inter-node" in th.reason


def test_classes_are_length_ranges_and_rings_are_well_formed():
    rng = np.random.default_rng(0)
    lengths = [int(x) for x in rng.lognormal(7.5, 1.3, 120).clip(1, 60000)] + [120000]
    plan = plan_batch(lengths, Topology(2, 4), TOY_PROFILE, TOY_MODEL)
    check_plan(plan)
    th = plan.thresholds
    for d in plan.docs:
        want = "local" if d.length <= th.local_max else "intra" if d.length <= th.intra_max else "inter"
        assert d.cls == want, (d, th)
    counts = plan.class_counts()
    assert counts["inter"] >= 1 and counts["intra"] >= 1 and counts["local"] >= 1
    for ring in plan.rings:
        if ring.cls == "inter":  # members grouped node by node: one NIC hop per node per step
            nodes = [plan.topology.node_of(r) for r in ring.ranks]
            assert nodes == sorted(nodes)
    assert dict(plan.meta)["granule"]


def test_placement_flags_follow_the_config():
    ctx = toy_context(nodes=2, gpus=2, config=ZeppelinConfig(gpus_per_node=2, remap=False, routing="off"))
    p = plan_zeppelin([5000, 300, 200], ctx)
    assert (p.remap, p.routing) == (False, False)
    p = plan_zeppelin([5000, 300, 200], toy_context(nodes=2, gpus=2))
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
            "from megatron_zeppelin.topology import Topology\n"
            f"print(plan_batch({lengths!r}, Topology(2, 4), TOY_PROFILE, TOY_MODEL).digest())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert out.stdout.strip() == plan.digest()


def test_paper_workloads_beat_the_stock_baselines():
    """Issue 2's setting: 4 nodes x 8 A800, llama-7b, ~1M tokens, 64K context. The targets
    (imbalance <= 1.05, <= 1.15x the lower bound) are measured by benchmarks/bench_planner.py;
    here: every plan is valid, Zeppelin predicts a faster iteration than packed DP,
    and stays within 1.35x of the lower bound."""
    from megatron_zeppelin.workloads import sample_batch
    prof, model = load_profile("a800"), load_model("llama-7b")
    topo = Topology(4, 8, prof.nics_per_node, prof.gpu_to_nic)
    for ds in ("arxiv", "github", "prolong64k"):
        lengths = sample_batch(ds, 1 << 20, seed=0, max_len=65536)
        z = plan_batch(lengths, topo, prof, model, strategy="zeppelin")
        check_plan(z)
        for base in ("packed_dp",):
            b = plan_batch(lengths, topo, prof, model, strategy=base)
            assert z.predicted_iteration_s < b.predicted_iteration_s, (ds, base)
        assert z.predicted_iteration_s / z.lower_bound_s < 1.35, ds
