"""The remap plan: a token-balanced linear layout, every token once, kept tokens in order, and the
least transportation cost (checked against scipy's LP solver on small random cases)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.optimize import linprog

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.planner.build.assemble import assemble
from megatron_zeppelin.planner.build.checks import check_plan
from megatron_zeppelin.planner.context import Placement
from megatron_zeppelin.planner.build.remap import (
    balanced_targets, link_costs, plan_remap, remap_cost, remap_exchange_s, remap_exchanges,
    transfer_matrix)
from megatron_zeppelin.planner.testing import toy_context
from megatron_zeppelin.planner.types import DocPlan, Segment, Thresholds
from megatron_zeppelin.spec.topology import Topology


def _layout_from(rank_docs):
    """rank_docs[r] = list of lengths: each becomes one whole document on rank r (fresh doc ids);
    a document split as two segments checks that multi-segment tails are cut correctly."""
    out, doc = [], 0
    for lens in rank_docs:
        segs = []
        for L in lens:
            if L >= 4:  # two segments of one document, out of order (like zigzag chunks)
                segs += [Segment(doc, L // 2, L), Segment(doc, 0, L // 2)]
            else:
                segs.append(Segment(doc, 0, L))
            doc += 1
        out.append(tuple(segs))
    return tuple(out)


def _tokens(segs):
    return [(s.doc, p) for s in segs for p in range(s.start, s.stop)]


def _check_layouts(att, lin, moves):
    # Every token exactly once in the linear layout.
    assert sorted(t for r in att for t in _tokens(r)) == sorted(t for r in lin for t in _tokens(r))
    for r, (a, l) in enumerate(zip(att, lin)):
        sent = {t for m in moves if m.src == r for t in _tokens(m.segments)}
        got = [t for m in sorted(moves, key=lambda m: m.src) if m.dst == r for t in _tokens(m.segments)]
        kept = [t for t in _tokens(a) if t not in sent]
        # Kept tokens keep their order and come first; received ones follow in source-rank order.
        assert _tokens(l) == kept + got
        # Senders give a tail: what stays is a prefix of the attention layout.
        assert kept == _tokens(a)[:len(kept)]
        assert not (sent and got), "a rank never both sends and receives"


rank_docs_st = st.integers(1, 3).flatmap(lambda nodes: st.integers(1, 4).flatmap(
    lambda gpus: st.tuples(st.just(nodes), st.just(gpus), st.lists(
        st.lists(st.integers(1, 9), max_size=3), min_size=nodes * gpus, max_size=nodes * gpus))))


@settings(max_examples=150, deadline=None)
@given(rank_docs_st)
def test_balanced_every_token_once_order_kept(case):
    nodes, gpus, rank_docs = case
    att = _layout_from(rank_docs)
    topo = Topology(nodes, gpus)
    lin, moves = plan_remap(att, topo)
    counts = [sum(len(s) for s in r) for r in lin]
    assert max(counts) - min(counts) <= 1
    _check_layouts(att, lin, moves)
    assert all(m.tokens > 0 and m.src != m.dst for m in moves)
    assert len({(m.src, m.dst) for m in moves}) == len(moves)


def _lp_optimum(counts, topo, costs, lo, hi):
    """min sum cost(s,d) f(s,d) s.t. out - in + t_r = c_r, lo_r <= t_r <= hi_r (network LP: integral)."""
    a, b = costs
    w = len(counts)
    pairs = [(s, d) for s in range(w) for d in range(w) if s != d]
    n = len(pairs) + w
    c = np.zeros(n)
    A = np.zeros((w, n))
    for k, (s, d) in enumerate(pairs):
        c[k] = a if topo.same_node(s, d) else b
        A[s, k] += 1
        A[d, k] -= 1
    for r in range(w):
        A[r, len(pairs) + r] = 1
    bounds = [(0, None)] * len(pairs) + list(zip(lo, hi))
    res = linprog(c, A_eq=A, b_eq=np.asarray(counts, float), bounds=bounds, method="highs")
    assert res.status == 0
    return res.fun


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.data(), st.floats(1.0, 20.0), st.booleans())
def test_cost_equals_lp_optimum(nodes, gpus, data, ratio, with_caps):
    w = nodes * gpus
    counts = data.draw(st.lists(st.integers(0, 12), min_size=w, max_size=w))
    topo = Topology(nodes, gpus)
    costs = (1.0, ratio)
    total = sum(counts)
    if with_caps:
        caps = data.draw(st.lists(st.integers(0, 12), min_size=w, max_size=w))
        if sum(caps) < total:
            with pytest.raises(ZeppelinError, match="capacities"):
                balanced_targets(counts, topo, caps, costs)
            return
        # Water level L: the largest with sum(min(cap, L)) <= total.
        L = max(x for x in range(0, 14) if sum(min(c, x) for c in caps) <= total)
        lo, hi = [min(c, L) for c in caps], [min(c, L + 1) for c in caps]
    else:
        caps = None
        lo, hi = [total // w] * w, [total // w + 1] * w
    tgt = balanced_targets(counts, topo, caps, costs)
    assert sum(tgt) == total and all(l <= t <= h for l, t, h in zip(lo, tgt, hi))
    flows = transfer_matrix(counts, tgt, topo)
    got = sum(n * (1.0 if topo.same_node(s, d) else ratio) for (s, d), n in flows.items())
    assert got == pytest.approx(_lp_optimum(counts, topo, costs, lo, hi), abs=1e-7)


def test_plan_remap_cost_matches_flows_and_cost_model():
    ctx = toy_context(nodes=2, gpus=2)
    att = _layout_from([[9, 3], [1], [2], []])
    a, b = link_costs(ctx.cost)
    assert 0 < a < b  # NVLink per token cheaper than a NIC
    lin, moves = plan_remap(att, ctx.topology, cost=ctx.cost)
    counts = [sum(len(s) for s in r) for r in att]
    # Per-token seconds are ~1e-9: the LP solver gets them scaled to (1, b/a).
    lp = _lp_optimum(counts, ctx.topology, (1.0, b / a), [3] * 4, [4] * 4)
    assert remap_cost(moves, ctx.topology, (1.0, b / a)) == pytest.approx(lp, rel=1e-9)
    _check_layouts(att, lin, moves)


def test_capacities_are_followed():
    topo = Topology(1, 4)
    att = _layout_from([[10], [2], [1], [1]])
    lin, moves = plan_remap(att, topo, capacities=[2, 8, 2, 8])
    assert [sum(len(s) for s in r) for r in lin] == [2, 5, 2, 5]  # water level 5, capped at 2
    _check_layouts(att, lin, moves)
    lin, moves = plan_remap(att, topo, capacities=[3, 7, 1, 3])  # sum = 14 tokens: exact targets
    assert [sum(len(s) for s in r) for r in lin] == [3, 7, 1, 3]
    _check_layouts(att, lin, moves)
    with pytest.raises(ZeppelinError, match="capacities"):
        plan_remap(att, topo, capacities=[1, 1, 1])
    with pytest.raises(ZeppelinError, match="topology"):
        plan_remap(att, Topology(1, 2))


def test_balanced_input_moves_nothing():
    att = _layout_from([[3], [1, 2], [2, 1]])
    lin, moves = plan_remap(att, Topology(1, 3))
    assert moves == () and lin == att


def test_exchange_count_and_time():
    assert remap_exchanges(4) == 14  # 4 to linear + 3 back, forward and backward
    ctx = toy_context(nodes=2, gpus=2, nics=1)
    att = _layout_from([[8], [], [], []])
    lin, moves = plan_remap(att, ctx.topology, cost=ctx.cost)
    t = remap_exchange_s(moves, ctx.cost)
    nic_tokens = sum(m.tokens for m in moves if not ctx.topology.same_node(m.src, m.dst))
    assert nic_tokens == 4  # the other node's deficit (targets 2 each)
    # Ranks 2 and 3 share one NIC: both wait for all 4 tokens; rank 1 only for its 2 NVLink tokens.
    nic_s = ctx.cost.transfer_s(4 * ctx.cost.hidden_bytes_per_token, "nic")
    assert t[0] == t[2] == t[3] == pytest.approx(nic_s)
    assert 0 < t[1] < t[0]


def test_assembled_plan_with_remap_checks_and_predicts():
    ctx = toy_context(nodes=2, gpus=2)
    lengths = [40, 3, 5, 2, 7]
    owners = [0, 1, 2, 2, 3]
    docs = [DocPlan(i, L, "local", -1, o, (0, L)) for i, (L, o) in enumerate(zip(lengths, owners))]
    plan = assemble("packed_dp", lengths, ctx, Placement(docs, [], Thresholds(40, 40), remap=True))
    check_plan(plan)
    counts = [plan.tokens(r, "linear") for r in range(4)]
    assert max(counts) - min(counts) <= 1 and plan.remap
    assert plan.cost[0].remap_s > 0
    assert all(c.remap_s == 0 for r, c in enumerate(plan.cost)
               if all(r not in (m.src, m.dst) for m in plan.remap))
