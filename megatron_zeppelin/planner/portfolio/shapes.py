"""The fixed-shape plans Zeppelin also weighs, so that its predicted time is never above a baseline's.

Zeppelin's greedy (partition.py) builds rings document by document; the baselines' shapes are
different: every document over uniform CP groups of one size (static_cp, and the ablation's
static_cp+routing with the routing layer on), ByteScale-style groups (hybrid_dp), Megatron's
dynamic-CP groups (dynamic_cp). Each such placement is a plan Zeppelin's engine can run, so it is a
candidate: assembled with Zeppelin's remap (time-balanced) and without it, with routing where a
ring spans nodes (and without, as static_cp runs), and the least predicted plan of all wins.

Every candidate is built by the baseline's own placement function, so "Zeppelin never loses to a
baseline (predicted)" holds by construction on every batch, for every run-level setting the
baseline could deploy: each CP size of the domain, and each ``max_seqlen_per_dp_cp_rank`` of
dynamic_cp's ladder. p2p rings and static_cp's a2a (Ulysses) rings, at each CP size that divides
the heads (``a2a<cp>``), and its a2a+p2p rings at each split that can run (``a2a+p2p<a>x<p>``,
static_cp.hier_problem), are candidates as ``--zeppelin-cp-comm-type`` allows (the all-gather CP
variant keeps its own kernel).

>>> from megatron_zeppelin.planner.testing import toy_context   # 4 Q heads, 2 K/V heads: a2a over 2
>>> [label for label, _, _ in fixed_shape_candidates([8, 6, 4, 2], toy_context(gpus=4, capacity=16))]
['cp1', 'cp2', 'cp4', 'a2a2', 'a2a+p2p2x2', 'hybrid_dp', 'dynamic_cp/16', 'dynamic_cp/8', 'dynamic_cp/4', 'dynamic_cp/2']
"""

from __future__ import annotations

import heapq
from itertools import chain
from typing import Dict, Sequence

import numpy as np

from megatron_zeppelin.planner.baselines.cp_groups import cp_sizes
from megatron_zeppelin.planner.baselines.dynamic_cp import dynamic_cp_placement, gpus_needed
from megatron_zeppelin.planner.baselines.hybrid_dp import plan_hybrid_dp
from megatron_zeppelin.planner.baselines.static_cp import (cp_comms, cp_placement, heads_error,
                                                          hier_problem, hier_splits)
from megatron_zeppelin.planner.build.assemble import activation_weights, memory_caps
from megatron_zeppelin.planner.build.levels import linear_level
from megatron_zeppelin.planner.build.schedule import block_tokens
from megatron_zeppelin.planner.portfolio.budget import build_units
from megatron_zeppelin.planner.context import Placement, PlanContext
from megatron_zeppelin.planner.cost.predict import attention_tokens
from megatron_zeppelin.planner.types import PlanError, ring_documents
from megatron_zeppelin.spec.topology import link_ports
from megatron_zeppelin.spec.words import Comm, DocClass, Link


SMALL_BATCH = 4  # documents per rank up to which hybrid_dp's and dynamic_cp's shapes are candidates too
# Documents per batch up to which hybrid_dp's shape is a candidate whatever the count per rank: its
# grouping takes ~25 ms at 256 documents (0.4 s at 1,000). Without it, the 30B model's github batches
# (7-10 documents per rank on 8 ranks) were predicted up to 12% slower than hybrid_dp's own plan, and
# 3 of the 36 configurations of the `main` study lost to hybrid_dp by 0.2-1.8%.
HYBRID_DOCS = 256


def fixed_shape_candidates(lengths: Sequence[int], ctx: PlanContext, reach: float = float("inf")):
    """(label, bound, build) of every baseline shape of this batch: ``bound`` a cheap lower bound of
    its predicted time (None: only known once built), ``build`` raises PlanError when the shape does
    not fit the capacity; a CP size whose mean per-rank work alone is at or above ``reach`` gets that
    bound without its groups (thousands of documents: its packing was most of the time to weigh it).
    hybrid_dp's and dynamic_cp's own groupings take seconds to build on
    thousands of documents, so they are candidates only for batches of up to SMALL_BATCH documents
    per rank (where those baselines' shapes differ most from Zeppelin's greedy), and hybrid_dp's
    also for batches of up to HYBRID_DOCS documents."""
    world, cost = ctx.topology.world_size, ctx.cost
    L = np.asarray(lengths, dtype=np.int64)
    order = None
    out, packed, held = [], {}, {}
    comms = cp_comms(ctx)  # --zeppelin-cp-comm-type: the comm types the static_cp shapes may use
    settings = [(cp, Comm.P2P, f"cp{cp}", 1) for cp in cp_sizes(world) if Comm.P2P in comms or cp == 1]  # cp1: no ring
    for cp in cp_sizes(world):
        try:
            if cp > 1 and Comm.A2A in comms:
                heads_error(ctx, cp)
                settings.append((cp, Comm.A2A, f"a2a{cp}", 1))
        except PlanError:
            continue  # the heads do not split over this CP size: TE refuses a2a there
    if Comm.A2A_P2P in comms:  # TE's hierarchical a2a+p2p, every split that can run
        settings += [(cp, Comm.A2A_P2P, f"a2a+p2p{a}x{cp // a}", a) for cp in cp_sizes(world)
                     for a in hier_splits(ctx, cp) if not hier_problem(ctx, cp, a)]
    for cp, comm, label, a2a in settings:
        # Every member of a CP group computes the same attention of each of its documents (zigzag:
        # ring_member_attention, a2a: its heads' share of each whole document, as compute_bound
        # prices the built placement), and the group's projections and recompute split evenly at
        # best; the MLP then runs wherever it runs best in its node (the remap moves it inside
        # nodes). Bounds the plan before it is built.
        member = member_attention(cost, L, np.full(len(L), cp), comm, a2a=a2a)
        build = (lambda cp=cp, comm=comm, a2a=a2a: cp_placement(lengths, ctx, cp, comm, a2a, pad=False))  # own engine: no TE pad
        # The busiest node's level is at least the mean over ranks: every member's documents, all
        # projections, recompute and MLP (0.999: the water level rounds node tokens)
        mean = 0.999 * BOUND_SLACK * _mean_work(L, member, cp, ctx, comm, a2a)
        if mean >= reach:
            out.append((label, mean, build))
            continue
        if order is None:  # longest first, ties by index: one sort for every CP size
            order = np.argsort(-L, kind="stable").tolist()
        if cp not in packed:  # one packing per CP size: its p2p, a2a and a2a+p2p shapes share it
            packed[cp] = lpt_groups(order, lengths, world // cp)
        groups = packed[cp]
        tokens = np.bincount(groups, weights=L, minlength=world // cp) / cp
        own = np.bincount(groups, weights=member, minlength=world // cp) + cost.proj_s_np(tokens)
        again, rate_again = _recomputed_share(L, groups, cp, tokens, ctx, comm, a2a)
        rows = node_rows(np.repeat(own + again, cp), np.repeat(tokens, cp), ctx, rate_again)
        bound = BOUND_SLACK * (1 - 1e-9) * water_level(*rows)  # (1 - 1e-9: sums in another order)
        if comm in (Comm.P2P, Comm.A2A_P2P) and cp > 1 and bound < reach:  # its rings' chains, exactly as once built
            bound = max(bound, cp_chain_bound(L, groups, cp, ctx, a2a, held))
        out.append((label, bound, build))
    small = len(lengths) <= SMALL_BATCH * world
    if small or len(lengths) <= HYBRID_DOCS:
        out.append(("hybrid_dp", None, lambda: plan_hybrid_dp(lengths, ctx)))
    if small:
        top = 1 << (world.bit_length() - 1)
        m, longest, n = ctx.capacity, max(lengths), 0
        while m >= 1 and gpus_needed(longest, m) <= top and n <= world.bit_length():
            out.append((f"dynamic_cp/{m}", None, (lambda m=m: megatron_groups(lengths, ctx, m))))
            m, n = m // 2, n + 1
    return out


def megatron_groups(lengths: Sequence[int], ctx: PlanContext, mslpr: int) -> Placement:
    """dynamic_cp's shape as Megatron deploys it (its rounds scheduled on the padded lengths), laid
    out on Zeppelin's engine without the pad rows; where those groups overfill a rank, the rounds
    scheduled on the real lengths (the scheduler is not monotone in them, either may fit alone).
    Raises PlanError where neither is built."""
    try:
        pl = dynamic_cp_placement(lengths, ctx, mslpr, pad=False, schedule_pad=True)
        if attention_tokens(pl.docs, pl.rings, ctx.topology.world_size).max() <= ctx.capacity:
            return pl  # its rounds merged still fit (assembly's check)
    except PlanError:
        pass
    return dynamic_cp_placement(lengths, ctx, mslpr, pad=False)


def lpt_groups(order, lengths: Sequence[int], groups: int) -> list:
    """static_cp.cp_assignment's groups (each document, longest first, to the group with the fewest
    tokens; ties: the lower group) from the visiting ``order`` computed once for every CP size:
    the pre-build bounds packed each size again, and at 16k documents its sort was a tenth of planning.

    >>> from megatron_zeppelin.planner.baselines.static_cp import cp_assignment
    >>> L = [5, 9, 1, 9, 4, 4, 7]
    >>> order = sorted(range(len(L)), key=lambda i: (-L[i], i))
    >>> all(lpt_groups(order, L, k) == cp_assignment(L, k) for k in (1, 2, 3, 4, 8))
    True
    """
    heap = [(0, k) for k in range(groups)]
    out = [0] * len(lengths)
    replace_top = heapq.heapreplace  # (tokens, group) pairs are distinct: the least is the same as pop + push
    for i in order:
        tok, k = heap[0]
        out[i] = k
        replace_top(heap, (tok + lengths[i], k))
    return out


def cp_chain_bound(L: np.ndarray, groups, cp: int, ctx: PlanContext, a2a: int = 1, memo=None) -> float:
    """``ring_chain_bound`` of the CP shape of size ``cp`` (p2p, or a2a+p2p in a2a groups of ``a2a``)
    whose documents go to ``groups`` (aligned
    blocks of consecutive ranks, as cp_placement builds it), routed or not as candidate_placements
    would weigh it (the lesser), before the build: the same value, so a shape whose chains alone
    cannot beat the best so far is never built (on small batches CP 16-64 over NICs: their builds
    and bounds were most of the search). 0 where the build would refuse the shape (over capacity).

    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> from megatron_zeppelin.planner.baselines.static_cp import cp_assignment, cp_placement
    >>> ctx, L = toy_context(nodes=2, gpus=2), [4000, 3000, 500]
    >>> cp_chain_bound(np.asarray(L), cp_assignment(L, 2), 2, ctx) == ring_chain_bound(cp_placement(L, ctx, 2, Comm.P2P, pad=False), ctx)
    True
    """
    topo, n_groups = ctx.topology, ctx.topology.world_size // cp
    memo = {} if memo is None else memo  # per CP size (same groups): each member's tokens
    if cp not in memo:
        bounds = (np.arange(2 * cp + 1, dtype=np.int64) * np.asarray(L, dtype=np.int64)[:, None]) // (2 * cp)
        chunks = np.diff(bounds, axis=1)  # zigzag_bounds' chunks; member i holds chunks i and 2cp-1-i
        tok = np.zeros((n_groups, cp), dtype=np.int64)
        np.add.at(tok, np.asarray(groups, dtype=np.int64), chunks[:, :cp] + chunks[:, :cp - 1:-1])
        memo[cp] = tok
    tok = memo[cp]
    if tok.max(initial=0) > ctx.capacity:
        return 0.0
    used = np.flatnonzero(np.bincount(groups, minlength=n_groups))
    kvb = ctx.cost.kv_bytes_per_token
    if a2a > 1:  # a2a+p2p: the rings of its groups, never routed (candidate_placements)
        return chain_bound([c for k in used.tolist()
                            for c in hier_chains(tuple(range(k * cp, (k + 1) * cp)), tok[k].tolist(), a2a, kvb)],
                           False, ctx)
    rings = [(tuple(range(k * cp, (k + 1) * cp)), tok[k].tolist(), kvb, "p2p") for k in used.tolist()]
    routed = float("inf")
    if cp > topo.gpus_per_node and ctx.config.routing_enabled(topo.nodes):  # its rings span nodes
        routed = chain_bound(rings, True, ctx)
    return min(chain_bound(rings, False, ctx, above=routed), routed)


def member_attention(cost, lengths, rings, comm=Comm.P2P, passes=(False, True), a2a=1) -> np.ndarray:
    """Attention seconds (all layers) of one member of a ring of ``rings`` members for each document
    of ``lengths``: zigzag p2p (and all-gather) rings ``ring_member_attention_np``; a2a (Ulysses)
    rings each whole document causal at 1/G of its FLOPs plus one sequence per pass (program.py's
    a2a blocks; the kernel call a Compute pays once per rank is left out: a lower bound, as the
    documents of a ring share each step's call); a2a+p2p rings (a2a groups of ``a2a``, per ring or
    one for all) a member of the ring of rings / a2a groups at 1/a2a of the heads (its per-sequence
    costs divided too: still a lower bound).

    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> c = toy_context().cost
    >>> a = member_attention(c, [8000], [2], Comm.A2A, passes=(False,))[0]
    >>> bool(abs(a - (c.block_flops_s(8000, 8000, True) / 2 + c.seq_s()) * c.model.layers) < 1e-15)
    True
    """
    if comm == Comm.A2A_P2P:
        a = np.maximum(np.broadcast_to(np.asarray(a2a, dtype=np.int64), np.shape(rings)), 1)
        return cost.ring_member_attention_np(lengths, np.asarray(rings, dtype=np.int64) // a, passes, calls=False) / a
    if comm != Comm.A2A:
        return cost.ring_member_attention_np(lengths, rings, passes, calls=False)  # a ring's documents share a call
    L, G = np.asarray(lengths, dtype=np.float64), np.maximum(np.asarray(rings, dtype=np.float64), 1)
    return sum(np.where(L > 0, cost.block_flops_s(L, L, True, p) / G + cost.seq_s(p), 0.0)
               for p in passes) * cost.model.layers


def spans_nodes(placement: Placement, ctx: PlanContext) -> bool:
    return any(r.cls == DocClass.INTER for r in placement.rings)


def candidate_placements(lengths: Sequence[int], ctx: PlanContext, best_s: float = float("inf"), budget=None):
    """(bound, label, placement) of every fitting fixed shape whose bound is below ``best_s``, routed
    where a ring spans nodes (and the config allows routing) and also unrouted; placements have
    remap off (the caller adds it). ``budget`` (portfolio/budget.py): notes the shapes skipped for
    their bound, and each build is charged (a shape it cannot afford is not built)."""
    from dataclasses import replace
    routing = ctx.config.routing_enabled(ctx.topology.nodes)
    for label, bound, build in fixed_shape_candidates(lengths, ctx, best_s):
        if bound is not None and bound >= best_s:
            if budget is not None:
                budget.skipped(label)
            continue
        if budget is not None and not budget.afford(label, build_units(len(lengths), ctx.topology.world_size)):
            continue
        try:
            pl = build()
        except PlanError:
            continue
        pl = replace(pl, remap=False, balance_linear=False, routing=False, meta=dict(pl.meta))
        pl.meta["shape"] = label
        b = compute_bound(pl, ctx)
        yield max(b, ring_chain_bound(pl, ctx)), label, pl
        if routing and spans_nodes(pl, ctx) and all(r.comm == Comm.P2P for r in pl.rings):  # a2a kinds: not routed
            routed = replace(pl, routing=True, meta=dict(pl.meta))
            yield max(b, ring_chain_bound(routed, ctx)), label + "+routing", routed


BOUND_SLACK = 0.97  # the bounds below are the prediction's own compute terms; slack for its step granularity


def compute_bound(placement: Placement, ctx: PlanContext) -> float:
    """A cheap lower bound of a placement's predicted iteration from compute alone (a rank computes
    one thing at a time; communication and waiting only add), times BOUND_SLACK, for both variants
    a candidate is assembled in. Per rank its attention (whole local documents, zigzag ring shares)
    and its projections (they run on the attention layout), then the MLP and vocab head:

    - remap off: on the rank's own attention-layout tokens;
    - time-balanced remap: each node's tokens spread over its ranks as evenly as they can be within
      the memory caps the remap honours (assemble.memory_caps: node_time_targets never gives a rank
      more; the remap keeps node totals), the capped water level of ``capped_level``.

    The lesser of the two bounds the candidate. A candidate whose bound is above the best plan so
    far need not be assembled."""
    cost, world = ctx.cost, ctx.topology.world_size
    att = _attention(placement, ctx)
    tokens = attention_tokens(placement.docs, placement.rings, world)
    own = att + cost.proj_s_np(tokens) + a2a_wait_bound(placement, ctx)
    rate = movable_linear_s(1, cost)  # per token (linear in tokens)
    again, rate_again = recomputed_s(placement, ctx, tokens)
    own, rate = own + again, rate + rate_again
    off = float((own + rate * tokens).max())
    if not ctx.config.remap or rate == 0.0:  # no remap variant, or nothing it can move (MoE)
        return BOUND_SLACK * off
    g = ctx.topology.gpus_per_node
    caps = memory_caps(tokens.astype(np.int64), g, *activation_weights(cost), ctx.capacity)
    return BOUND_SLACK * min(off, capped_level(own.reshape(-1, g), rate, caps.reshape(-1, g),
                                               tokens.reshape(-1, g).sum(axis=1)))


def a2a_wait_bound(placement: Placement, ctx: PlanContext) -> np.ndarray:
    """Per rank, the seconds it waits at least on its a2a (Ulysses) exchanges, all layers, where
    nothing of its own can run meanwhile: a placement whose every document is on a2a rings of one
    queue (static_cp's a2a shapes), zeros otherwise. The layer program (program.py) then waits on
    each of its four exchanges with no compute between post and wait (forward Q/K/V in, output
    home at the end; backward dO in, dQ/dK/dV home at the end), and predict's ``_exchange`` gives a
    rank's wait at least latency + the busiest port of each of its messages / bandwidth from its
    own clock: ports loaded as ``link_ports`` keys them (NVLink per GPU, NIC ports shared by the
    GPUs wired to one NIC, every network level on the NIC's ports), by every ring of the exchange.
    Without it an a2a CP 16 or 32 shape on a few documents per rank was bounded at its compute
    (0.57-0.65 of its prediction) and prepared on every small batch (~0.1 s each at 64 ranks).

    >>> from megatron_zeppelin.planner.testing import toy_context   # 4 Q heads, 2 K/V heads
    >>> from megatron_zeppelin.planner.baselines.static_cp import cp_placement
    >>> ctx = toy_context(nodes=2, gpus=2)
    >>> a = a2a_wait_bound(cp_placement([4000, 4000], ctx, 2, Comm.A2A), ctx)
    >>> bool((a > 0).all()), bool(a2a_wait_bound(cp_placement([4000, 4000], ctx, 2, Comm.P2P), ctx).any())
    (True, False)
    """
    topo, cost = ctx.topology, ctx.cost
    world, g = topo.world_size, topo.gpus_per_node
    rings = [r for r in placement.rings if r.size > 1]
    out = np.zeros(world)
    if (not rings or any(r.comm != Comm.A2A for r in rings) or len({r.cls for r in rings}) > 1
            or any(d.cls == DocClass.LOCAL for d in placement.docs)):
        return out
    docs = ring_documents(placement.docs, placement.rings)
    src, dst, tok, rows = [], [], [], []
    for r in rings:  # every (member i -> member j) pair: Q/K/V of block i (step 0), output of block j (step 1)
        G = r.size
        ranks = np.asarray(r.ranks, dtype=np.int64)
        sizes = np.asarray(block_tokens(r, docs), dtype=np.float64)
        i, j = np.nonzero(~np.eye(G, dtype=bool))
        src.append(ranks[i])
        dst.append(ranks[j])
        tok.append(sizes[i])
        rows.append(np.full(len(i), G, dtype=np.int64))
    src, dst, tok, G = map(np.concatenate, (src, dst, tok, rows))
    qb, kvb = cost.model.q_bytes_per_token(cost.tp), cost.kv_bytes_per_token
    if not qb or np.any((qb + kvb) % G) or np.any(qb % G):
        return out  # no a2a row sizing (schedule.a2a_row_bytes refuses it)
    node_s, node_d = src // g, dst // g
    near = node_s == node_d
    gmap = np.asarray(topo.gpu_to_nic, dtype=np.int64)
    nic_s = node_s * topo.nics_per_node + gmap[src % g]
    nic_d = node_d * topo.nics_per_node + gmap[dst % g]
    # Link class per message: NVLink inside a node, else the lowest network level holding both nodes
    pairs = {}
    for a, b in zip(node_s[~near].tolist(), node_d[~near].tolist()):
        if (a, b) not in pairs:
            pairs[(a, b)] = cost.link_of(a * g, b * g)  # a level joins nodes: any of their ranks
    lat = np.where(near, cost.latency(Link.NVLINK), 0.0)
    inv = np.where(near, 1.0 / cost.bandwidth(Link.NVLINK), 0.0)
    far = np.flatnonzero(~near)
    if len(far):
        cls = [pairs[(a, b)] for a, b in zip(node_s[far].tolist(), node_d[far].tolist())]
        lat[far] = [cost.latency(c) for c in cls]
        inv[far] = [1.0 / cost.bandwidth(c) for c in cls]
    total = np.zeros(world)
    # (bytes per token row, sender -> receiver or reversed): forward Q/K/V and output; backward dO and dQ/dK/dV
    for step, reverse in ((0, False), (1, False), (1, True), (0, True)):
        nbytes = tok * ((qb + (kvb if step == 0 else 0)) // G)
        s_rank, d_rank, s_nic, d_nic = (src, dst, nic_s, nic_d) if step == 0 else (dst, src, nic_d, nic_s)
        if reverse:
            s_rank, d_rank, s_nic, d_nic = d_rank, s_rank, d_nic, s_nic
        nv_out = np.bincount(s_rank[near], nbytes[near], minlength=world)
        nv_in = np.bincount(d_rank[near], nbytes[near], minlength=world)
        nics = world // g * topo.nics_per_node
        nic_out = np.bincount(s_nic[~near], nbytes[~near], minlength=nics)
        nic_in = np.bincount(d_nic[~near], nbytes[~near], minlength=nics)
        busiest = np.where(near, np.maximum(nv_out[s_rank], nv_in[d_rank]),
                           np.maximum(nic_out[s_nic], nic_in[d_nic]))
        t = np.where(nbytes > 0, lat + busiest * inv, 0.0)
        wait = np.zeros(world)
        np.maximum.at(wait, s_rank, t)
        np.maximum.at(wait, d_rank, t)
        total += wait
    return total * cost.model.layers


def _attention(placement: Placement, ctx: PlanContext, passes=(False, True)):
    """Per rank the attention seconds of its whole local documents and its zigzag ring shares
    (``passes``: both, or the forward alone), all layers."""
    cost, world = ctx.cost, ctx.topology.world_size
    length, local = {d.doc: d.length for d in placement.docs}, DocClass.LOCAL
    loc = [d for d in placement.docs if d.cls == local]
    owners = np.fromiter([d.owner for d in loc], dtype=np.int64, count=len(loc))
    att = (np.bincount(owners, cost.ring_member_attention_np([d.length for d in loc], [1] * len(loc), passes),
                       minlength=world) if loc else np.zeros(world))
    for comm in {r.comm for r in placement.rings}:
        pairs = [(length[i], r) for r in placement.rings if r.comm == comm for i in r.docs]  # each ring document
        if pairs:
            member = member_attention(cost, [L for L, _ in pairs], [r.size for _, r in pairs], comm, passes,
                                      [r.a2a for _, r in pairs])
            # each member adds its documents' shares in pair order (np.add.at: unbuffered, in index
            # order), the same float additions as one ``att[ranks] += t`` per pair, without the loop
            idx = np.fromiter(chain.from_iterable(r.ranks for _, r in pairs), dtype=np.int64)
            np.add.at(att, idx, np.repeat(member, [r.size for _, r in pairs]))
    return att


def recomputed_s(placement: Placement, ctx: PlanContext, tokens):
    """What activation recompute runs again in the backward (``cost.recompute``, as predict and
    lower_bound price it): per rank the forward of its core attention (ring members' shares, local
    documents whole) and of its projections, and per linear-layout token the forward MLP; (per-rank
    seconds, seconds per movable token)."""
    cost, world = ctx.cost, ctx.topology.world_size
    w_att, w_proj, rate = _recompute_terms(ctx)
    per_rank = np.zeros(world)
    if w_att:
        per_rank += w_att * _attention(placement, ctx, passes=(False,))
    if w_proj:
        per_rank += w_proj * (cost.gemm_s(tokens, "qkv") + cost.gemm_s(tokens, "out"))
    return per_rank, rate


def _mean_work(L, member, cp: int, ctx: PlanContext, comm=Comm.P2P, a2a: int = 1) -> float:
    """Per rank on average, what a CP placement of size ``cp`` (rings of ``comm``) computes: each
    document's ``member`` attention on its cp members, the projections, recompute and MLP of every token."""
    cost, world = ctx.cost, ctx.topology.world_size
    total = float(L.sum())
    w_att, w_proj, rate_again = _recompute_terms(ctx)
    again = 0.0
    if w_att:
        again += w_att * cp * float(member_attention(cost, L, [cp] * len(L), comm, (False,), a2a).sum()) / world
    if w_proj:
        again += w_proj * float(cost.gemm_s(total / world, "qkv") + cost.gemm_s(total / world, "out"))
    return (cp * float(member.sum()) / world + float(cost.proj_s_np([total / world])[0]) + again
            + movable_linear_s(total, cost) / world + rate_again * total / world)


def _recompute_terms(ctx: PlanContext):
    """What ``cost.recompute`` runs again, as weights summed over its layer groups (block recompute:
    only its first layers): of a rank's forward attention (core_attn), of the projections' forward
    per token (full), and seconds per movable token (the forward MLP). One place for recomputed_s
    and the CP bounds before the build."""
    cost, layers = ctx.cost, ctx.cost.model.layers
    w_att = w_proj = rate = 0.0
    for n, rc in cost.recompute.groups(layers):
        if rc.has("core_attn"):
            w_att += n / layers
        if rc.has("mlp") and not cost.model.is_moe:
            rate += n * float(cost.gemm_s(1, "mlp"))
        if rc.full:
            w_proj += n
    return w_att, w_proj, rate


def _recomputed_share(L, groups, cp: int, tokens, ctx: PlanContext, comm=Comm.P2P, a2a: int = 1):
    """``recomputed_s`` of a CP group's member before its placement is built: its documents' forward
    member attention again (core_attn), its share ``tokens`` of projections (full); and per movable
    token the forward MLP (mlp). (per-group seconds, seconds per movable token)."""
    cost = ctx.cost
    w_att, w_proj, rate = _recompute_terms(ctx)
    per_group = np.zeros(len(tokens))
    if w_att:
        fwd = member_attention(cost, L, np.full(len(L), cp), comm, (False,), a2a)
        per_group += w_att * np.bincount(groups, weights=fwd, minlength=len(tokens))
    if w_proj:
        per_group += w_proj * (cost.gemm_s(tokens, "qkv") + cost.gemm_s(tokens, "out"))
    return per_group, rate


def capped_level(own, rate: float, caps, need) -> float:
    """The least possible busiest rank when each node (row) spreads its ``need`` tokens over its
    ranks, ``rate`` seconds each, a rank taking at most its ``caps`` and keeping its ``own`` seconds:
    per node the level T with sum(clip((T - own) / rate, 0, caps)) = need (levels.linear_level), or
    its busiest ``own`` where that is higher; the busiest node's.

    >>> import numpy as np
    >>> capped_level(np.array([[1.0, 2.0]]), 1.0, np.array([[10, 10]]), np.array([3]))  # (3 + 3) / 2
    3.0
    >>> capped_level(np.array([[1.0, 2.0]]), 1.0, np.array([[1, 10]]), np.array([3]))   # rank 0 takes 1 token
    4.0
    """
    own = np.asarray(own, dtype=np.float64)
    level = linear_level(own, rate, np.asarray(caps, dtype=np.float64), np.asarray(need, dtype=np.float64))
    return float(max(level.max(), own.max()))


def node_rows(own, tokens, ctx: PlanContext, rate_again: float = 0.0):
    """Per node, its ranks' ``own`` seconds and the movable seconds of its ``tokens`` (and
    ``rate_again`` per token: the MLP recompute runs again): the remap of every Zeppelin candidate
    keeps each node's tokens (node_time_targets, or no remap), so the MLP and head of a node's
    tokens run inside it."""
    g, cost = ctx.topology.gpus_per_node, ctx.cost
    node_tokens = np.asarray(tokens, dtype=np.float64).reshape(-1, g).sum(axis=1)
    return (np.asarray(own).reshape(-1, g),
            [movable_linear_s(int(round(t)), cost) + rate_again * t for t in node_tokens])


def movable_linear_s(tokens: int, cost) -> float:
    """Iteration seconds of the work the remap may move, for the batch's ``tokens``: the MLP and the
    vocab head (cost_model.mlp_s, linear in tokens); none for MoE layers, whose expert load is not."""
    return 0.0 if cost.model.is_moe else cost.mlp_s(tokens)


def water_level(own, movable) -> float:
    """The least possible busiest rank when each rank has ``own`` seconds and ``movable`` seconds may
    go anywhere: fill the least busy ranks up to one level. With ``own`` as rows (nodes) and one
    ``movable`` per row, each row's seconds move only inside it: the busiest row's level.

    >>> water_level([1.0, 2.0, 6.0], 3.0)  # the first two fill up to 3: the busiest keeps its 6
    6.0
    >>> water_level([1.0, 2.0, 6.0], 11.0), water_level([4.0], 0.0)  # (11 + 9) / 3
    (6.666666666666667, 4.0)
    >>> water_level([[1.0, 2.0], [0.0, 0.0]], [3.0, 1.0])  # node 0: (3 + 3) / 2; node 1: 0.5
    3.0
    """
    a = np.sort(np.atleast_2d(np.asarray(own, dtype=np.float64)), axis=1)
    m = np.broadcast_to(np.asarray(movable, dtype=np.float64), (a.shape[0],))
    filled = np.cumsum(a, axis=1)
    need = np.arange(1, a.shape[1] + 1) * a - filled  # movable seconds that bring the k least busy to a[k-1]
    k = np.count_nonzero(need <= m[:, None], axis=1)  # need is non-decreasing and need[0] = 0: k >= 1
    level = (m + filled[np.arange(len(a)), k - 1]) / k
    return float(max(a[:, -1].max(), level.max()))


def ring_chain_bound(placement: Placement, ctx: PlanContext) -> float:
    """A second cheap lower bound, from communication alone (schedule.py's zigzag ring: at step s
    member i receives a block from member i - 1 and passes it on at step s + 1; program.py: a member
    posts step s + 1 only after its wait on step s). Two chains of hops, one after the other, each hop
    at least its link's latency plus its block's bytes over one link:

    - a member whose incoming hop is direct receives G - 1 blocks (every block but its own) over
      that hop, each posted only after it received the one before;
    - any block reaches the member before its owner after G - 1 hops along the ring (a routed hop:
      over all the node's NICs at once, every level above NVLink at its fastest).

    Both run in the forward and again in the backward of every layer; the longest chain of any ring
    bounds the iteration (tests/unit/test_candidate_bounds.py holds it below the prediction).

    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> from megatron_zeppelin.planner.baselines.static_cp import cp_placement
    >>> ctx = toy_context(nodes=2, gpus=2)
    >>> ring_chain_bound(cp_placement([4000, 4000], ctx, 4, Comm.P2P), ctx) > 0
    True
    >>> ring_chain_bound(cp_placement([4000, 4000], ctx, 1, Comm.P2P), ctx)  # no ring, no chain
    0.0
    """
    docs = ring_documents(placement.docs, placement.rings)
    kvb, chains = ctx.cost.kv_bytes_per_token, []
    for r in placement.rings:
        if r.size < 2 or not r.docs:
            continue
        if r.comm == Comm.P2P:
            chains.append((r.ranks, block_tokens(r, docs), kvb, (r.cls, "p2p")))
        elif r.comm == Comm.A2A_P2P:
            chains += hier_chains(r.ranks, block_tokens(r, docs), r.a2a, kvb, r.cls)
    return chain_bound(chains, placement.routing, ctx)


def hier_chains(ranks, tokens, a: int, kvb: int, queue: str = "inter") -> list:
    """The zigzag rings inside an a2a+p2p ring of ``ranks`` in a2a groups of ``a`` (schedule.py's
    ring_messages): for each head group j, the ring of the groups' j-th members passing each
    group's tokens (the sum of its members' blocks) at K/V bytes of 1/a of the heads, as
    (ranks, tokens, bytes per token, kind: their exchange, per queue and ring of p groups) for chain_bound.

    >>> hier_chains((0, 1, 2, 3), [5, 6, 7, 8], 2, 16)
    [((0, 2), [11, 15], 8, ('inter', 'a2a+p2p', 2)), ((1, 3), [11, 15], 8, ('inter', 'a2a+p2p', 2))]
    """
    p = len(ranks) // a
    sup = [sum(tokens[b * a:(b + 1) * a]) for b in range(p)]
    return [(tuple(ranks[b * a + j] for b in range(p)), sup, kvb // a, (queue, "a2a+p2p", p)) for j in range(a)]


def chain_bound(rings, routing: bool, ctx: PlanContext, above: float = float("inf")) -> float:
    """``ring_chain_bound`` of zigzag rings given as (ranks, tokens of each member's block, bytes
    per token: K/V of the heads the ring carries), routed
    or not: the same arithmetic for a built placement and for a CP shape's groups before it is
    built (``cp_chain_bound``), so both give the same value. ``above``: a caller that takes the lesser
    of this and ``above`` (the routed chain) needs no more than that: the port term is left out there."""
    cost, topo = ctx.cost, ctx.topology
    outer = [c for c in cost.link_classes if c != Link.NVLINK]
    spread = topo.nics_per_node if routing else 1
    far = (min((cost.latency(c) for c in outer), default=0.0),
           1.0 / (spread * max((cost.bandwidth(c) for c in outer), default=float("inf"))))
    best, g_node = 0.0, topo.gpus_per_node
    nv = (cost.latency(Link.NVLINK), 1.0 / cost.bandwidth(Link.NVLINK))
    rate = {}  # link class -> (latency, seconds per byte)
    for ranks, tokens, kvb, *_ in rings:
        g = len(ranks)
        hop, direct = [], []  # hop i: member i -> i + 1, (latency, seconds per byte)
        for i in range(g):
            src, dst = ranks[i], ranks[(i + 1) % g]
            if src // g_node == dst // g_node:  # cost.link_of: NVLink inside a node
                hop.append(nv)
                direct.append(True)
                continue
            if routing:
                hop.append(far)
                direct.append(False)
                continue
            link = cost.link_of(src, dst)
            if link not in rate:
                rate[link] = (cost.latency(link), 1.0 / cost.bandwidth(link))
            hop.append(rate[link])
            direct.append(True)
        total, lat, inv = sum(tokens), sum([h[0] for h in hop]), sum([h[1] for h in hop])
        sent = g - tokens.count(0)  # an empty block is no message
        for b, n in enumerate(tokens):
            into = hop[b - 1]  # the hop into member b
            if n:  # block b along the ring: every hop but the one into its owner
                x = lat - into[0] + kvb * n * (inv - into[1])
                if x > best:
                    best = x
            if direct[b - 1]:  # member b receives every other (non-empty) block over the hop into it
                x = (sent - (n > 0)) * into[0] + kvb * (total - n) * into[1]
                if x > best:
                    best = x
    if not routing and 2 * cost.model.layers * best < above:  # (at or above ``above``: a caller's min drops it)
        best = max(best, shared_port_chain(rings, ctx))
    return 2 * cost.model.layers * best


PORT_CHAIN_CELLS = 1 << 20  # steps x hops of the rings up to which shared_port_chain is worked out


def shared_port_chain(rings, ctx: PlanContext) -> float:
    """The chain of the hops into each member again, for hops over the network: the rings post
    step s together (program.py: one exchange per queue and step), and predict.py's ``_exchange``
    gives each op latency + the busiest of its ports' bytes *of that exchange* / bandwidth, so GPUs
    that share a NIC share its port at every step (a800: two GPUs a NIC). Unrouted rings of one kind
    (all a queue's zigzag rings are one exchange a step; an a2a+p2p ring's rings of groups are
    another), each given as (ranks, tokens, bytes per token, kind); 0 where the steps x hops exceed
    PORT_CHAIN_CELLS (the bound is only weaker without it).

    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> ctx = toy_context(nodes=2, gpus=2, nics=1)   # both GPUs of a node on one NIC
    >>> one = shared_port_chain([((0, 2), [1000, 1000], 16, "p2p")], ctx)
    >>> two = shared_port_chain([((0, 2), [1000, 1000], 16, "p2p"), ((1, 3), [1000, 1000], 16, "p2p")], ctx)
    >>> bool(two > one > 0)   # the second ring's messages share the NIC ports of the first's
    True
    """
    cost, topo = ctx.cost, ctx.topology
    kinds: Dict[object, list] = {}
    for ring in rings:
        if len(ring[0]) >= 2:
            kinds.setdefault(ring[3] if len(ring) > 3 else "p2p", []).append(ring)
    best = 0.0
    for group in kinds.values():
        steps = max(len(r[0]) for r in group) - 1
        if steps * sum(len(r[0]) for r in group) > PORT_CHAIN_CELLS:
            continue
        port_id: Dict[tuple, int] = {}
        lat, inv, ports, sizes = [], [], [], []  # per network hop into a member
        for ranks, tokens, kvb, *_ in group:
            g = len(ranks)
            for b in range(g):
                src, dst = ranks[b - 1], ranks[b]
                if topo.same_node(src, dst):
                    continue
                link = cost.link_of(src, dst)
                q = [port_id.setdefault(k, len(port_id)) for k in link_ports(link, src, dst, -1, topo)]
                ports.append(q + [-1] * (4 - len(q)))  # -1: the all-zero column appended below
                lat.append(cost.latency(link))
                inv.append(1.0 / cost.bandwidth(link))
                row = np.zeros(steps)
                row[:g - 1] = [kvb * tokens[(b - 1 - s) % g] for s in range(g - 1)]  # member b-1 passes block b-1-s
                sizes.append(row)
        if not lat:
            continue
        ports_a, sizes_a = np.asarray(ports), np.asarray(sizes)  # (hops, 4), (hops, steps)
        load = np.zeros((len(port_id) + 1, steps))
        for j in range(ports_a.shape[1]):
            np.add.at(load, ports_a[:, j], sizes_a)
        load[-1] = 0.0
        busiest = load[ports_a].max(axis=1)  # (hops, steps)
        x = np.where(sizes_a > 0, np.asarray(lat)[:, None] + busiest * np.asarray(inv)[:, None], 0.0).sum(axis=1)
        best = max(best, float(x.max()))
    return best


def placement_key(placement: Placement) -> tuple:
    """Equal keys: the same documents on the same ranks (rings as rank tuples, their comm and a2a
    group size), the same routing."""
    ranks = {r.id: (r.ranks, r.comm, r.a2a) for r in placement.rings}
    return (placement.routing,) + tuple((d.owner, ranks.get(d.ring, ())) for d in sorted(placement.docs, key=lambda d: d.doc))
