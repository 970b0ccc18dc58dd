"""The batch's memo (PlanContext.exchanges: routed steps, priced exchanges) changes no number:
every candidate Zeppelin proposes costs the same priced with the memo its batch shares as priced
alone, and a routed placement priced again finds its routed steps' exchanges in the memo."""

from dataclasses import replace

import numpy as np
import pytest

import megatron_zeppelin.planner.strategies as strategies
from megatron_zeppelin.planner import make_context
from megatron_zeppelin.planner.build.assemble import prepare
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.sim.runs import domain_topology

# (cluster, model, tp, nodes, capacity tokens): routed and memory-bound, where +a2a versions share inter rings
CASES = [("a800", "llama-7b", 1, 2, 4608), ("h200", "llama-13b", 2, 2, 8192)]


def _context(cluster, model, tp, nodes, cap, seed=0):
    prof = load_profile(cluster)
    topo = domain_topology(prof, nodes, tp)
    cfg = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node, capacity_tokens=cap, tp=tp)
    world = topo.world_size
    lengths = np.random.default_rng(seed).lognormal(8.5, 1.4, 24 * nodes).clip(1, cap * world // 2).astype(int)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), 0.75 * cap * world))].tolist()
    return lengths, make_context(topo, prof, load_model(model), cfg, total_tokens=sum(lengths))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-cap{c[4]}")
def test_candidates_cost_the_same_with_the_batch_memo(case):
    lengths, ctx = _context(*case)
    cands = [c for c in strategies.get_strategy("zeppelin").propose(lengths, ctx, strategies.Search())
             if c.placement is not None]
    assert any(c.label.endswith("+a2a") for c in cands) and any(c.placement.routing for c in cands)
    for c in cands:
        shared = c.prepared if c.prepared is not None else prepare(ctx, c.placement)
        alone = prepare(replace(ctx, exchanges={}), c.placement)
        assert tuple(shared.parts) == tuple(alone.parts), c.label
        assert shared.ops == alone.ops, c.label
    routed = next(c.placement for c in cands if c.placement.routing and any(r.cls == "inter" for r in c.placement.rings))
    fresh = replace(ctx, exchanges={})
    first = prepare(fresh, routed)
    entries = len(fresh.exchanges["hops"])
    again = prepare(fresh, routed)  # priced again: its routed steps' exchanges are found
    assert len(fresh.exchanges["hops"]) - entries < entries and tuple(again.parts) == tuple(first.parts)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-cap{c[4]}")
def test_a_ring_alone_costs_the_same_on_any_ranks_of_its_node(case):
    """ulysses_rings.py prices an intra ring alone once per batch for its documents' cuts: the memo's
    time is the ring's own on every ranks it is asked for, and the Ulysses choice is the one made
    with every ring priced afresh."""
    import megatron_zeppelin.planner.partitioner.ulysses_rings as ulysses
    from megatron_zeppelin.planner.baselines.static_cp import a2a_heads_problem
    from megatron_zeppelin.spec.words import Comm, DocClass
    lengths, ctx = _context(*case)
    cands = [c for c in strategies.get_strategy("zeppelin").propose(lengths, ctx, strategies.Search())
             if c.placement is not None and not c.label.endswith("+a2a")]
    checked, moved = 0, 0
    ranks_of = {}
    for c in cands:
        docs = {d.doc: d for d in c.placement.docs if d.ring >= 0}
        for ring in c.placement.rings:
            if (ring.cls != DocClass.INTRA or ring.comm != Comm.P2P or not ring.docs
                    or a2a_heads_problem(ctx.cost.model, ctx.cost.tp, ring.size)):  # as with_a2a_rings asks
                continue
            for r in (ring, replace(ring, comm=Comm.A2A)):
                key = (r.comm, tuple((docs[d].length, tuple(docs[d].bounds)) for d in r.docs))
                moved += key in ranks_of and ranks_of[key] != r.ranks
                ranks_of.setdefault(key, r.ranks)
                assert ulysses._priced(r, docs, ctx) == ulysses.ring_seconds(r, docs, ctx), c.label
                checked += 1
        fresh = replace(ctx, exchanges={})
        a, b = ulysses.with_a2a_rings(c.placement, ctx), ulysses.with_a2a_rings(c.placement, fresh)
        assert (a is None) == (b is None) and (a is None or [r.comm for r in a.rings] == [r.comm for r in b.rings])
    assert checked > 0 and moved > 0  # the same documents' rings met again on other ranks
