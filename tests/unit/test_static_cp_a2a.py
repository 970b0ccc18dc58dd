"""static_cp's comm type as a run-level setting: TE's a2a (Ulysses) beside p2p, a2a only for CP sizes
dividing the Q and the K/V heads of a TP rank (TE asserts num_heads % cp_size == 0 for both)."""

from dataclasses import replace

import pytest

from megatron_zeppelin.planner import plan_batch
from megatron_zeppelin.planner.baselines.static_cp import a2a_candidates, cp_placement
from megatron_zeppelin.planner.build.assemble import assemble
from megatron_zeppelin.planner.build.checks import check_plan
from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE, toy_context
from megatron_zeppelin.planner.types import PlanError
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.topology import Topology

LENGTHS = [9000, 3000, 2500, 700, 400]  # toy model: 4 Q heads, 2 K/V heads


def _plan(lengths, model=TOY_MODEL, **cfg):
    return plan_batch(lengths, Topology(1, 4), TOY_PROFILE, model, ZeppelinConfig(gpus_per_node=4, **cfg),
                      strategy="static_cp")


def test_a2a_is_offered_where_the_heads_divide_and_refused_with_why():
    ctx = toy_context(gpus=4)
    got = {c.setting[1]: c for c in a2a_candidates(LENGTHS, ctx)}
    assert sorted(got) == [2, 4]
    assert got[2].error is None and {r.comm for r in got[2].placement.rings} == {"a2a"}
    assert got[4].placement is None and "does not divide the 2 K/V heads" in str(got[4].error)
    with pytest.raises(PlanError, match="use p2p or a CP size dividing both"):
        cp_placement(LENGTHS, ctx, 4, "a2a")


def test_static_cp_tries_both_comm_types_and_keeps_the_fastest():
    auto = _plan(LENGTHS)
    p2p = dict(auto.meta.cp_size_predicted_s)
    a2a = dict(auto.meta.a2a_cp_size_predicted_s)
    assert sorted(a2a) == [2] and p2p and set(p2p) <= {1, 2, 4}  # a2a 4: the 2 K/V heads do not divide
    assert auto.predicted_iteration_s == pytest.approx(min(list(p2p.values()) + list(a2a.values())), rel=1e-5)
    assert {r.comm for r in auto.rings} == {"a2a" if min(a2a.values()) < min(p2p.values()) else "p2p"}
    check_plan(auto)
    fixed = _plan(LENGTHS, cp_size=2)  # a fixed CP size still chooses its comm type
    assert set(dict(fixed.meta.a2a_cp_size_predicted_s)) == {2} and fixed.meta.cp_size == 2


def test_a2a_plan_checks_and_sizes_its_messages():
    mha = replace(TOY_MODEL, kv_heads=4)  # 4 K/V heads: a2a over 4 ranks too
    topo = Topology(1, 4)
    ctx = replace(toy_context(gpus=4), model=mha, cost=CostModel(mha, TOY_PROFILE, topo))
    p = assemble("static_cp", LENGTHS, ctx, cp_placement(LENGTHS, ctx, 4, "a2a"))
    check_plan(p)
    assert {r.comm for r in p.rings} == {"a2a"} and {o.step for o in p.schedule} == {0, 1}
    q = mha.q_bytes_per_token()
    assert p.meta.q_bytes_per_token == q and q % 4 == 0 and p.kv_bytes_per_token % 4 == 0
    assert all(o.nbytes == o.stop * ((q + p.kv_bytes_per_token) // 4 if o.step == 0 else q // 4) for o in p.schedule)
    auto = _plan(LENGTHS, model=mha)
    assert set(dict(auto.meta.a2a_cp_size_predicted_s)) == {2, 4}


def test_the_comm_type_can_be_fixed_per_run():
    p2p = _plan(LENGTHS, cp_comm="p2p")
    assert not p2p.meta.a2a_cp_size_predicted_s and {r.comm for r in p2p.rings} <= {"p2p"}
    a2a = _plan(LENGTHS, cp_comm="a2a")
    assert not a2a.meta.cp_size_predicted_s and {r.comm for r in a2a.rings} <= {"a2a"}
    assert set(dict(a2a.meta.a2a_cp_size_predicted_s)) == {2}  # CP 1 is over capacity, 4 does not divide
    only = toy_context(gpus=4, config=ZeppelinConfig(gpus_per_node=4, cp_comm="a2a"))
    assert [c.setting[1] for c in a2a_candidates(LENGTHS, only)] == [1, 2, 4]  # CP 1 (packed DP) offered too
    with pytest.raises(Exception, match="--zeppelin-cp-comm-type"):
        ZeppelinConfig(cp_comm="allgather")


def test_zeppelin_weighs_the_a2a_shapes():
    """Zeppelin's portfolio holds static_cp's a2a shapes: never slower than static_cp in either mode."""
    for comm in ("p2p", "a2a", None):
        cfg = ZeppelinConfig(gpus_per_node=4, cp_comm=comm)
        z = plan_batch(LENGTHS, Topology(1, 4), TOY_PROFILE, TOY_MODEL, cfg, strategy="zeppelin")
        s = plan_batch(LENGTHS, Topology(1, 4), TOY_PROFILE, TOY_MODEL, cfg, strategy="static_cp")
        assert z.predicted_iteration_s <= s.predicted_iteration_s * (1 + 1e-9), comm
        check_plan(z)
