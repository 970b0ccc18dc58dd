"""Zeppelin's bounded search (planner/portfolio/budget.py): a budget in deterministic work units cuts
what follows the partitioner, and the plan's meta says what was cut, for its bound or for the budget."""

import numpy as np
import pytest

from megatron_zeppelin.planner import Planner
from megatron_zeppelin.spec.config import ConfigError, ZeppelinConfig
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.topology import Topology


def _plan(budget_ms: float, n: int = 100, nodes: int = 8):
    prof = load_profile("a800")
    topo = Topology(nodes, 8, prof.nics_per_node, prof.gpu_to_nic)
    lengths = np.random.default_rng(0).lognormal(7.5, 1.3, n).clip(1, 65536).astype(np.int64)
    planner = Planner(topo, prof, load_model("llama-7b"), ZeppelinConfig(gpus_per_node=8, plan_budget_ms=budget_ms))
    return planner.plan(lengths)


def test_a_small_budget_cuts_after_the_partitioner_and_meta_names_the_cuts():
    free = _plan(0.0)  # the default: 10% of the predicted iteration; it may cut the later shapes
    meta = dict(free.meta)
    unbounded = _plan(1e6)
    assert "cut_budget" not in dict(unbounded.meta)
    # on this batch the partitioner's plan wins either way: what the default cut could not have won
    assert (free.meta.variant, free.predicted_iteration_s) == (unbounded.meta.variant, unbounded.predicted_iteration_s)
    assert "a2a32" in meta["cut_bound"].split(", ")  # its exchanges bound it out (a2a_wait_bound)
    tight = _plan(0.5)  # 24.5 units: less than any fixed shape after the partitioner's own rings
    cuts = dict(tight.meta)["cut_budget"].split(", ")
    bound = dict(tight.meta).get("cut_bound", "").split(", ")
    assert "a2a8" in cuts and "hybrid_dp" in cuts and not set(cuts) & set(bound)  # each cut named once, by its reason
    assert not [c for c in cuts if "aligned" in c]  # the partitioner's aligned rings are its own: never cut
    assert tight.meta.variant.split("/")[2] == "free"  # the paper's partitioner ran and won
    assert tight.predicted_iteration_s >= free.predicted_iteration_s
    assert _plan(0.5) == tight  # units, not a clock: the same cuts, the same plan


def test_a_budget_that_is_not_hit_changes_nothing():
    default = _plan(0.0, nodes=1)  # 8 ranks, one node: the default budget holds every candidate of this batch
    assert "cut_budget" not in dict(default.meta)
    assert default == _plan(1e6, nodes=1)


def test_a_negative_budget_names_its_flag():
    with pytest.raises(ConfigError, match="--zeppelin-plan-budget-ms"):
        ZeppelinConfig(plan_budget_ms=-1)


# One micro-batch of the accumulation study's worst configuration (a800, llama-7b, prolong64k,
# memory-bound: 32 ranks, 4561 tokens a rank, no recompute), 69 documents.
ACCUMULATION_MICRO_BATCH = [
    217, 702, 1139, 1085, 26, 1013, 120, 665, 547, 450, 299, 65536, 322, 2213, 307, 285, 311, 260, 1142,
    360, 3284, 455, 293, 159, 172, 145, 12599, 190, 40, 200, 107, 1017, 2928, 582, 170, 118, 208, 170, 357,
    790, 552, 45, 599, 625, 237, 237, 474, 1425, 393, 102, 139, 394, 218, 291, 520, 779, 850, 58, 199, 1701,
    1758, 712, 338, 428, 878, 289, 159, 479, 874]


def test_the_default_budget_weighs_the_cheap_shape_that_wins():
    # The partitioner's routed placements cost more units than the default budget here; they used to
    # be spent from it, and the aligned ring and costly routed shapes (lower bounds first) took the
    # rest, so a2a CP 32, predicted 15% faster, was cut. After the partitioner, cheapest first.
    prof = load_profile("a800")
    topo = Topology(4, 8, prof.nics_per_node, prof.gpu_to_nic)
    config = ZeppelinConfig(gpus_per_node=8, nics_per_node=4, gpu_nic_map=prof.gpu_to_nic, cluster="a800",
                            capacity_tokens=4561)
    plan = Planner(topo, prof, load_model("llama-7b"), config).plan(ACCUMULATION_MICRO_BATCH)
    assert plan.meta.variant.startswith("a2a32/"), plan.meta.variant
    assert "a2a32" not in dict(plan.meta).get("cut_budget", "").split(", ")
    assert "cut_budget" in dict(plan.meta)  # the budget did bind: costly routed shapes were cut


# One micro-batch of the accumulation study's h200 llama3-8b github configuration (memory-bound,
# 32 ranks, 9726 tokens a rank, no recompute), 111 documents.
GITHUB_MICRO_BATCH = [
    1698, 524, 16, 6047, 2633, 411, 276, 719, 64, 817, 346, 285, 114, 169, 2938, 4237, 1119, 465, 123, 1578,
    6588, 38, 3276, 16, 290, 926, 56, 44, 674, 2035, 234, 4297, 144, 8288, 607, 729, 1339, 836, 9593, 17084,
    1199, 384, 76, 150, 508, 426, 467, 505, 1106, 58, 97, 3013, 1914, 212, 3976, 170, 335, 27, 1941, 494, 2772,
    1557, 587, 653, 3425, 391, 399, 569, 1855, 2245, 11056, 455, 3933, 184, 1382, 646, 8524, 1412, 261, 1351,
    934, 324, 336, 119, 44466, 671, 2570, 84, 95, 424, 427, 1957, 109, 1286, 6127, 126, 2327, 117, 945, 971,
    8750, 180, 711, 2884, 83, 535, 135, 176, 1616, 1664, 25423]


def test_the_partitioners_aligned_rings_are_never_cut():
    # Weighed cheapest first beside the fixed shapes, the aligned rings (costly in units, routed) were
    # cut here, and cheap a2a+p2p shapes took the budget: 1.045 s predicted against 0.851 s.
    prof = load_profile("h200")
    topo = Topology(4, 8, prof.nics_per_node, prof.gpu_to_nic)
    config = ZeppelinConfig(gpus_per_node=8, nics_per_node=prof.nics_per_node, gpu_nic_map=prof.gpu_to_nic,
                            cluster="h200", capacity_tokens=9726)
    plan = Planner(topo, prof, load_model("llama3-8b"), config).plan(GITHUB_MICRO_BATCH)
    assert not [c for c in dict(plan.meta).get("cut_budget", "").split(", ") if "aligned" in c]
    assert plan.predicted_iteration_s < 0.9, (plan.meta.variant, plan.predicted_iteration_s)
