"""A third cluster level is a YAML change: tests/unit/cluster_spine.yaml puts pairs of nodes under a
leaf switch and the pairs under an oversubscribed spine. The profile carries the level, the cost
model names the link of each rank pair from it, plans use it (and pass the checks), and the
prediction and the simulator charge its link: slower than the same machine without the spine."""

import dataclasses
import os

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.planner import plan_batch
from megatron_zeppelin.planner.build.checks import check_plan
from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.planner.testing import TOY_MODEL
from megatron_zeppelin.planner.types import Plan
from megatron_zeppelin.spec.hardware import HardwareProfile, load_profile
from megatron_zeppelin.sim.iteration import simulate, simulate_attention
from megatron_zeppelin.spec.topology import Topology

SPINE = os.path.join(os.path.dirname(__file__), "cluster_spine.yaml")
TOPO = Topology(4, 2, 2)  # pods of nodes {0, 1} and {2, 3}
CFG = ZeppelinConfig(gpus_per_node=2, capacity_tokens=8000)
LENGTHS = [60000, 1000, 1000, 1000]  # the long document needs all 8 ranks: its ring crosses the spine


def _flat(p: HardwareProfile) -> HardwareProfile:
    """The same machine with every node pair on the NIC level (two levels)."""
    return dataclasses.replace(p, levels=(), nic_nodes=0)


def test_the_level_comes_from_the_yaml():
    p = load_profile(SPINE)
    assert list(p.links) == ["nvlink", "nic", "spine"] and p.spans == (2, 0)
    assert HardwareProfile.from_dict(p.to_dict()) == p
    c = CostModel(TOY_MODEL, p, TOPO)
    assert [c.link_of(0, r) for r in (1, 2, 3, 4, 7)] == ["nvlink", "nic", "nic", "spine", "spine"]
    assert c.bandwidth("spine") == 11.75e9 and abs(c.latency("spine") - 25e-6) < 1e-15
    assert [CostModel(TOY_MODEL, _flat(p), TOPO).link_of(0, r) for r in (1, 4)] == ["nvlink", "nic"]


def test_plans_cross_the_spine_and_pass_the_checks():
    p = load_profile(SPINE)
    for strategy in ("static_cp", "zeppelin"):
        plan = plan_batch(LENGTHS, TOPO, p, TOY_MODEL, CFG, strategy=strategy)
        check_plan(plan)
        assert Plan.from_json(plan.to_json()) == plan
        spine = [o for o in plan.schedule if o.link == "spine"]
        assert spine, strategy
        for o in spine:  # every spine hop joins two pods, on the sender's NIC
            assert TOPO.node_of(o.src) // 2 != TOPO.node_of(o.dst) // 2 and o.nic == TOPO.nic_of(o.src)


def test_prediction_and_simulator_charge_the_spine():
    p = load_profile(SPINE)
    cfg = CFG.with_(cp_size=8)  # the same placement on both machines: one ring of all ranks
    plan = plan_batch(LENGTHS, TOPO, p, TOY_MODEL, cfg, strategy="static_cp")
    flat = plan_batch(LENGTHS, TOPO, _flat(p), TOY_MODEL, cfg, strategy="static_cp")
    assert [d.ring for d in plan.docs] == [d.ring for d in flat.docs]
    assert {o.link for o in flat.schedule} == {"nvlink", "nic"}
    assert plan.predicted_iteration_s > flat.predicted_iteration_s
    assert simulate_attention(plan, p, TOY_MODEL) > simulate_attention(flat, _flat(p), TOY_MODEL)
    res = simulate(plan, p, TOY_MODEL)
    spine_bytes = sum(o.nbytes for o in plan.schedule if o.link == "spine")
    assert res.link_bytes["spine"] > 0 and res.link_bytes["nic"] >= res.link_bytes["spine"]
    assert "spine" not in simulate(flat, _flat(p), TOY_MODEL).link_bytes and spine_bytes > 0
