"""check_plan accepts real plans and names each broken invariant of a corrupted one."""

from dataclasses import replace

import pytest

from megatron_zeppelin.planner import PlanError
from megatron_zeppelin.planner.build.checks import check_plan
from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE
from megatron_zeppelin.planner.types import RankCost, Segment
from megatron_zeppelin.spec.topology import Topology

LENGTHS = [90000, 12000, 5000, 4000, 700, 300, 200, 100, 64, 9]


@pytest.fixture(scope="module")
def plan():
    # One fixed Zeppelin variant (crossover classes, time-balanced remap), so that the plan exercises
    # every part the checks cover whichever variant plan_zeppelin would pick for this toy batch.
    from megatron_zeppelin.planner import make_context
    from megatron_zeppelin.planner.build.assemble import assemble
    from megatron_zeppelin.planner.partitioner.partition import _plan_variant
    ctx = make_context(Topology(2, 4), TOY_PROFILE, TOY_MODEL, total_tokens=sum(LENGTHS))
    p = assemble("zeppelin", LENGTHS, ctx, _plan_variant(LENGTHS, ctx, "all", "hide", "time"))
    check_plan(p)
    c = p.class_counts()
    assert c["inter"] and c["intra"] and c["local"] and p.remap
    assert {o.stage for o in p.schedule} >= {"dispatch", "transfer"}  # routed
    return p


def _bad(plan, match, capacity=None):
    with pytest.raises(PlanError, match=match):
        check_plan(plan, capacity=capacity)


def _ring_doc(plan, cls):
    return next(d for d in plan.docs if d.cls == cls)


def test_docs_corruptions(plan):
    _bad(replace(plan, docs=plan.docs[:-1]), "docs: plan.docs must list")
    d = _ring_doc(plan, "intra")
    docs = list(plan.docs)
    docs[d.doc] = replace(d, length=d.length + 1)
    _bad(replace(plan, docs=tuple(docs)), "has length")
    docs[d.doc] = replace(d, bounds=(0,) + d.bounds[2:-1] + (d.bounds[1], d.length))
    _bad(replace(plan, docs=tuple(docs)), "zigzag")
    local = next(x for x in plan.docs if x.cls == "local")
    docs = list(plan.docs)
    docs[local.doc] = replace(local, owner=plan.world_size)
    _bad(replace(plan, docs=tuple(docs)), "local document")


def test_ring_corruptions(plan):
    rings = list(plan.rings)
    k = next(i for i, r in enumerate(rings) if r.cls == "intra")
    rings[k] = replace(rings[k], ranks=(0, 4))
    _bad(replace(plan, rings=tuple(rings)), "intra ring")
    rings = list(plan.rings)
    rings[k] = replace(rings[k], docs=rings[k].docs + (plan.docs[-1].doc,))
    _bad(replace(plan, rings=tuple(rings)), "not on it")
    _bad(replace(plan, rings=tuple(reversed(plan.rings))), "rings")


def test_layout_and_capacity_corruptions(plan):
    att = [list(r) for r in plan.attention_layout]
    r = next(i for i, x in enumerate(att) if len(x) >= 2)
    att[r] = att[r][::-1]
    _bad(replace(plan, attention_layout=tuple(tuple(x) for x in att)), "attention layout of rank")
    att = [list(r) for r in plan.attention_layout]
    att[r] = att[r][1:]
    _bad(replace(plan, attention_layout=tuple(tuple(x) for x in att)), "attention layout")
    lin = [list(x) for x in plan.linear_layout]
    s = lin[0][0]
    lin[0][0] = Segment(s.doc, s.start, s.stop - 1) if len(s) > 1 else Segment(s.doc, s.start, s.stop + 1)
    _bad(replace(plan, linear_layout=tuple(tuple(x) for x in lin)), "linear layout")
    most = max(plan.tokens(r) for r in range(plan.world_size))
    check_plan(plan, capacity=most)
    _bad(plan, "capacity", capacity=most - 1)


def test_remap_corruptions(plan):
    m = plan.remap[0]
    moves = list(plan.remap)
    moves[0] = replace(m, dst=(m.dst + 1) % plan.world_size if (m.dst + 1) % plan.world_size != m.src else (m.dst + 2) % plan.world_size)
    _bad(replace(plan, remap=tuple(moves)), "remap")
    moves = list(plan.remap)
    moves[0] = replace(m, src=(m.src + 1) % plan.world_size if (m.src + 1) % plan.world_size != m.dst else (m.src + 2) % plan.world_size)
    _bad(replace(plan, remap=tuple(moves)), "remap")
    _bad(replace(plan, remap=plan.remap[1:]), "remap")


def test_schedule_corruptions(plan):
    ops = list(plan.schedule)
    _bad(replace(plan, schedule=tuple(ops[1:])), "schedule")
    o = ops[0]
    bad = replace(o, nbytes=o.nbytes + 1)
    _bad(replace(plan, schedule=(bad,) + tuple(ops[1:])), "bytes")
    direct = next(i for i, o in enumerate(ops) if o.stage == "direct")
    ops2 = list(ops)
    ops2[direct] = replace(ops[direct], stop=ops[direct].stop - 1, nbytes=ops[direct].nbytes - plan.kv_bytes_per_token)
    _bad(replace(plan, schedule=tuple(ops2)), "rows")
    t = next(i for i, o in enumerate(ops) if o.stage == "transfer")
    ops3 = list(ops)
    ops3[t] = replace(ops[t], nic=ops[t].nic + 1)
    _bad(replace(plan, schedule=tuple(ops3)), "NIC")
    extra = replace(ops[0], step=999)
    _bad(replace(plan, schedule=tuple(ops) + (extra,)), "not one the rings need")
    ops4 = [o for o in ops if o.stage != "dispatch"]  # proxies would forward rows they never got
    _bad(replace(plan, schedule=tuple(ops4)), "not held")


def test_prediction_corruptions(plan):
    _bad(replace(plan, cost=plan.cost[1:]), "prediction")
    cost = list(plan.cost)
    cost[0] = RankCost(float("nan"), 0.0, 0.0, 0.0)
    _bad(replace(plan, cost=tuple(cost)), "prediction")
