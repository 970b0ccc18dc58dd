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


def test_static_cp_tries_every_comm_type_and_keeps_the_fastest():
    auto = _plan(LENGTHS)
    p2p = dict(auto.meta.cp_size_predicted_s)
    a2a = dict(auto.meta.a2a_cp_size_predicted_s)
    hier = dict(auto.meta.a2a_p2p_predicted_s)
    assert sorted(a2a) == [2] and p2p and set(p2p) <= {1, 2, 4}  # a2a 4: the 2 K/V heads do not divide
    assert sorted(hier) == ["2x2"]  # a2a groups of 2 in a CP group of 4: the only split
    best = {"p2p": min(p2p.values()), "a2a": min(a2a.values()), "a2a+p2p": min(hier.values())}
    assert auto.predicted_iteration_s == pytest.approx(min(best.values()), rel=1e-5)
    assert {r.comm for r in auto.rings} == {min(best, key=best.get)}
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


# --- TE's hierarchical a2a+p2p: a2a groups of a ranks of one node, a ring of the groups ---------------
def _plan2x4(lengths, model=TOY_MODEL, **cfg):
    return plan_batch(lengths, Topology(2, 4), TOY_PROFILE, model, ZeppelinConfig(gpus_per_node=4, **cfg),
                      strategy="static_cp")


def test_a2a_p2p_splits_where_the_node_and_the_heads_allow():
    """CP 8 on 2 nodes x 4 GPUs: a2a groups of 2 (they divide the 4 GPUs of a node and the 4 Q / 2
    K/V heads); groups of 4 split the K/V heads unevenly: refused, with why; CP 4 in groups of 2."""
    lengths = [20000, 9000, 3000, 2500, 700, 400]
    p = _plan2x4(lengths, cp_comm="a2a+p2p")
    check_plan(p)
    assert sorted(dict(p.meta.a2a_p2p_predicted_s)) == ["2x2", "2x4"]
    assert {(r.comm, r.a2a) for r in p.rings} == {("a2a+p2p", 2)}
    a, g = (int(x) for x in p.meta.hierarchical_cp_sizes.split())  # Megatron's two sizes
    assert a * g == p.meta.cp_size and {r.size for r in p.rings} == {p.meta.cp_size}
    ctx = toy_context(nodes=2, gpus=4)
    with pytest.raises(PlanError, match="does not divide the 2 K/V heads"):
        cp_placement(lengths, ctx, 8, "a2a+p2p", a2a=4)
    mha = replace(TOY_MODEL, kv_heads=4)
    assert sorted(dict(_plan2x4(lengths, model=mha, cp_comm="a2a+p2p").meta.a2a_p2p_predicted_s)) == \
        ["2x2", "2x4", "4x2"]
    fixed = _plan2x4(lengths, model=mha, cp_comm="a2a+p2p", cp_size=8, cp_a2a_size=4)  # fixed per run
    assert [x for x, _ in fixed.meta.a2a_p2p_predicted_s] == ["4x2"] and fixed.meta.hierarchical_cp_sizes == "4 2"


def test_a2a_p2p_plan_sizes_its_messages_and_round_trips():
    lengths = [20000, 9000, 3000]
    p = _plan2x4(lengths, cp_comm="a2a+p2p", cp_size=8, cp_a2a_size=2)
    q, kv = TOY_MODEL.q_bytes_per_token(), p.kv_bytes_per_token
    assert p.meta.q_bytes_per_token == q
    per_step = {0: kv // 2, 1: kv // 2, 2: kv // 2, 3: kv // 2, 4: (q + kv) // 2, 5: q // 2}  # p = 4
    assert all(o.nbytes == (o.stop - o.start) * per_step[o.step] for o in p.schedule)
    inter = {o.step for o in p.schedule if o.link == "nic"}
    assert inter and inter <= {0, 1, 2, 3}  # the all-to-alls stay inside a node: only the ring crosses
    assert type(p).from_json(p.to_json()) == p


def test_a2a_p2p_is_refused_in_config_with_the_flag():
    with pytest.raises(Exception, match="--zeppelin-cp-a2a-size"):
        ZeppelinConfig(cp_a2a_size=1)
    assert ZeppelinConfig(cp_comm="a2a+p2p").cp_comm == "a2a+p2p"
