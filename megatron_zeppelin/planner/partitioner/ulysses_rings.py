"""Zeppelin's own a2a (Ulysses) rings: an intra-node ring may run as an all-to-all over heads.

Issue 49 item 3. The greedy places documents on zigzag (p2p) rings. Inside a node an all-to-all
costs about what a ring step does over NVLink, and a Ulysses member attends whole documents for
1/G of the heads (one long causal kernel instead of 2G^2 small blocks, and no ring waits), so for
some rings it is faster. Each intra ring whose size divides the Q and K/V heads of a TP rank (TE's
rule, static_cp.a2a_heads_problem) is priced both ways by the layer program (ring_costs: the
busiest member's attention + exposed exchange, that ring alone) and runs as a2a where that is
lower. The placement with those rings is one more candidate of the pick (``+a2a`` in the variant),
so the plan is never predicted slower for it. Inter rings stay p2p (their NIC transfer is what
the zigzag ring hides). ``--zeppelin-cp-comm-type`` other than auto and a2a turns it off.

>>> from megatron_zeppelin.planner.testing import toy_context
>>> from megatron_zeppelin.planner.baselines.cp_groups import placement_from_groups
>>> ctx = toy_context(nodes=1, gpus=2)   # 4 Q heads, 2 K/V heads: rings of 2 may run a2a
>>> pl = placement_from_groups([6000, 40], {0: (0, 1), 1: (1,)}, ctx, "p2p")
>>> [r.comm for r in with_a2a_rings(pl, ctx).rings]
['a2a']
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from megatron_zeppelin.planner.build.schedule import ring_ops
from megatron_zeppelin.planner.context import Placement, PlanContext
from megatron_zeppelin.planner.cost.predict import ring_costs
from megatron_zeppelin.spec.words import Comm, DocClass


def ring_seconds(ring, docs, ctx: PlanContext) -> float:
    """The busiest member's attention + exposed exchange seconds (all layers, forward and backward)
    of ``ring`` alone, by the layer program."""
    cost, r = ctx.cost, replace(ring, id=0)
    own = [docs[d] for d in ring.docs]
    dmap = {d.doc: replace(d, ring=0) for d in own}
    ops = ring_ops([r], dmap, ctx.topology, cost.kv_bytes_per_token, cost.link_of, cost.model.q_bytes_per_token(cost.tp))
    att, exp = ring_costs(list(dmap.values()), [r], ops, cost)
    return max(att[k] + exp[k] for k in ring.ranks)


def with_a2a_rings(placement: Placement, ctx: PlanContext) -> Optional[Placement]:
    """``placement`` with each intra ring that is faster as a2a switched to it; None when none is."""
    from megatron_zeppelin.planner.baselines.static_cp import a2a_heads_problem, cp_comms

    if Comm.A2A not in cp_comms(ctx):
        return None
    docs = {d.doc: d for d in placement.docs if d.ring >= 0}
    rings, switched = [], False
    for ring in placement.rings:
        if (ring.cls == DocClass.INTRA and ring.comm == Comm.P2P and ring.docs
                and not a2a_heads_problem(ctx.cost.model, ctx.cost.tp, ring.size)):
            a2a = replace(ring, comm=Comm.A2A)
            if _priced(a2a, docs, ctx) < _priced(ring, docs, ctx):
                ring, switched = a2a, True
        rings.append(ring)
    return replace(placement, rings=rings, meta=dict(placement.meta)) if switched else None


def _priced(ring, docs, ctx: PlanContext) -> float:
    """``ring_seconds`` of an intra ring, once per batch for each (kind, size, documents' cuts): alone
    on one node's NVLink, where every GPU has its own port, a ring takes the same time on whichever
    of the node's ranks it sits, and the candidates of a batch (free and aligned rings, hidden and
    forced inter documents) put the same documents on rings of the same size again and again. The
    memo is the batch's (PlanContext.exchanges)."""
    key = ("ring alone", ring.comm, ring.size, ring.a2a,
           tuple((docs[d].length, tuple(docs[d].bounds)) for d in ring.docs))
    got = ctx.exchanges.get(key)
    if got is None:
        got = ctx.exchanges[key] = ring_seconds(ring, docs, ctx)
    return got

