"""Zeppelin's sequence partitioner: LPT over ranks, splitting documents too big for one rank.

A rank's *load* is the predicted time of what it holds: attention (the cost model's quadratic
cost with the profile's length-dependent efficiency) plus the linear time of its tokens. The
*budget* B is the batch's total work over the ranks (the lower bound: every document whole, perfect
balance). The remap layer then evens out what the greedy leaves inside each node (assemble.py).

1. Classes are eligibility ranges (thresholds.py, from the cost model's crossovers): a document of
   at most ``local_max`` tokens always stays whole (no ring step of it can hide its NVLink
   transfer); a longer one may run on an intra-node ring; from ``intra_max + 1`` tokens it may also
   span nodes (a 2-member ring across 2 nodes hides its routed NIC transfer).
2. Documents, longest first (ties by index), each go where they raise the busiest rank touched
   least, preferring the cheapest form that stays within B:
   - local, on the least-loaded rank with room, if that rank stays within B (or the document is
     too short to split);
   - else an intra ring: the smallest size G whose G least-loaded ranks of some node (with room
     for their zigzag share) stay within B (the aligned variants: the power-of-two block of one
     node whose busiest member stays lowest); members cost ring_member_attention(L, G) + their
     tokens' linear time (equal for every member: zigzag);
   - else, if the document may span nodes, an inter ring of the smallest G (among sizes whose ring
     steps hide the routed NIC transfer) whose G least-loaded ranks of the domain stay within B,
     taken from the fewest nodes and ordered node by node (only the hops between nodes use NICs).
     Nodes thus receive fractions of a long document, which whole-document node buckets cannot;
   - if nothing stays within B, the form with the least resulting maximum (ties: local, intra,
     smaller G).
3. Documents on the same ranks and class share one ring.

The short documents (at most ``local_max``: the tail of the visiting order, most of a batch) are
placed in numpy batches with the one-at-a-time result (lpt.py).

Determinism: documents are visited in (-length, index) order and every choice breaks ties by
(load, rank), so the decisions depend on the lengths only; any permutation of the input gives each
document the place a document of the same length had before.

Worked example (toy model, 1 node x 4 GPUs): a rank's budget is 0.255 ms; the 8000-token
document costs 0.72 ms whole, so the greedy puts it on a ring (of 4: members of a 3-ring would
exceed the budget, as smaller chunks run slower); the 5000-token one (0.29 ms) exceeds the budget
too and takes a 3-ring; the short ones fill rank 3, the least loaded (LPT). That plan is predicted
at 0.403 ms; the fixed-shape candidate CP 4 (every document on one zigzag ring of 4, static_cp's
shape, portfolio/shapes.py) at 0.402 ms, and TE's a2a+p2p over the same 4 ranks (a2a in pairs, a
ring of the 2 pairs) at 0.379 ms, so on this tiny batch the last wins: Zeppelin never predicts
slower than a baseline's shape.

>>> from megatron_zeppelin.planner.testing import toy_context
>>> p = plan_zeppelin([8000, 5000, 300, 200, 100, 90], toy_context(nodes=1, gpus=4))
>>> p.meta["variant"], [(r.ranks, r.docs, r.comm) for r in p.rings]
('a2a+p2p2x2/off', [((0, 1, 2, 3), (0, 1, 2, 3, 4, 5), 'a2a+p2p')])
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Dict, Iterator, List, Sequence, Tuple

import numpy as np

from megatron_zeppelin.planner.context import Placement, PlanContext
from megatron_zeppelin.planner.build.assemble import prepare
from megatron_zeppelin.planner.build.layout import zigzag_bounds
from megatron_zeppelin.planner.choice import MEMORY_SLACK
from megatron_zeppelin.planner.partitioner.lpt import place_short
from megatron_zeppelin.planner.strategies import Candidate, Search, pick, strategy
from megatron_zeppelin.planner.partitioner.thresholds import inter_share, zeppelin_thresholds
from megatron_zeppelin.planner.partitioner.ulysses_rings import with_a2a_rings
from megatron_zeppelin.planner.portfolio.shapes import (candidate_placements, compute_bound, megatron_groups,
                                                          placement_key, ring_chain_bound)
from megatron_zeppelin.planner.portfolio.budget import chunk_rows_of, placement_units
from megatron_zeppelin.planner.types import DocPlan, PlanError, Ring
from megatron_zeppelin.spec.words import DocClass, Link, StrategyName

_INF = float("inf")
_TABLES_AHEAD = 32  # documents whose intra ring tables one pricing pass takes (_ring_tables)
_LOCAL = DocClass.LOCAL  # bound once: _placement reads it per document (spec/words.py)


def _ring_table(ctx: PlanContext, length: int, sizes: np.ndarray, rate: float):
    """Per ring size G in ``sizes``: member time (attention + linear of its tokens), most tokens
    a member holds, and whether a ring step hides its NVLink / routed NIC transfer (one layer)."""
    return _ring_tables(ctx, [length], sizes, rate)[0]


def _ring_tables(ctx: PlanContext, lengths: Sequence[int], sizes: np.ndarray, rate: float) -> list:
    """``_ring_table`` of each of ``lengths``, priced in one vectorised pass (the greedy asks for
    the longest documents' tables one after the other: numpy's cost is per call, not per entry)."""
    cost = ctx.cost
    length = np.asarray(lengths, dtype=np.int64)[:, None]
    G = sizes.astype(np.float64)[None, :]
    c = np.maximum(1, length // (2 * sizes)).astype(np.float64)  # zigzag chunk tokens
    # One pricing call per pass for the full blocks and the diagonal (causal) ones of every size.
    n = c.shape[1]
    cc, causal = np.concatenate([c, c], axis=1), np.arange(2 * n) >= n
    fwd, bwd = cost.block_pass_s(cc, cc, causal), cost.block_pass_s(cc, cc, causal, backward=True)
    blk_c = 2 * fwd[:, :n]  # forward blocks of one ring step (2 full blocks, one layer)
    blk_b = 2 * bwd[:, :n]
    step_c, step_b = blk_c + cost.call_s(), blk_b + cost.call_s(True)  # in one kernel call
    full = (blk_c + blk_b) / 2 * cost.model.layers
    calls = G * (cost.call_s() + cost.call_s(True)) * cost.model.layers  # a call per ring step
    member_att = 2 * ((fwd[:, n:] + bwd[:, n:]) * cost.model.layers) + (2 * G - 1) * full + calls  # block_s_np(c, c, True)
    need = 2 * -(-length // (2 * sizes))  # tokens of a member's two chunks, at most
    nbytes = cost.kv_bytes_per_token * length / G
    x_nv = cost.latency(Link.NVLINK) + nbytes / cost.bandwidth(Link.NVLINK)
    x_nic = cost.latency(Link.NIC) + nbytes * inter_share(ctx) / cost.bandwidth(Link.NIC)
    hide_nv, hide_nic = step_c >= x_nv, step_c >= x_nic
    # What a member waits for the ring's transfers, all layers: per step, the forward K/V transfer
    # beyond the forward compute and the backward K/V + dK/dV beyond the backward compute.
    steps = cost.model.layers * (G - 1)
    wait_nv = steps * (np.maximum(0, x_nv - step_c) + np.maximum(0, 2 * x_nv - step_b))
    wait_nic = steps * (np.maximum(0, x_nic - step_c) + np.maximum(0, 2 * x_nic - step_b))
    cols = (member_att + rate * need, need, hide_nv, hide_nic, wait_nv, wait_nic, member_att)
    return list(zip(*cols))  # per length: its row of each column


class _Ranks:
    """Per-rank load (seconds) and attention tokens, with a lazy min-heap for LPT picks; the loads
    and tokens also as arrays, for the ring choices' masks (kept equal entry by entry).

    A rank without room for a pick's document is *parked* (a max-heap by room) rather than popped
    and pushed back on every pick: the greedy asks longest first, so once ranks fill up (a tight
    capacity, or the tail of a large batch) nearly every rank lacked room for the last document
    and draining them all per pick made planning quadratic in the documents. A parked rank returns
    to the load heap when a pick's document fits its room; ``add`` gives a rank a fresh load-heap
    entry (its parked one goes stale). Every rank has exactly one live entry (version ``ver``), in
    one heap or the other, so a pick still returns the least (load, rank) with room."""

    def __init__(self, world: int, cap: int):
        self.load = [0.0] * world  # lists: the heap's picks touch single entries
        self.tok = [0] * world
        self.load_np, self.tok_np = np.zeros(world), np.zeros(world, dtype=np.int64)
        self.att = [0.0] * world  # load without the linear time of the tokens
        self.cap = cap
        self.ver = [0] * world
        self.heap = [(0.0, r, 0) for r in range(world)]
        self.parked = []  # (-room, rank, version, load): ranks too full for an earlier pick

    def least_loaded(self, need: int):
        """(load, rank) of the least-loaded rank with room for ``need`` tokens, or None."""
        heap, parked, ver, tok, cap = self.heap, self.parked, self.ver, self.tok, self.cap
        while parked and -parked[0][0] >= need:  # room enough now: back to the load heap
            _, r, v, t = heapq.heappop(parked)
            if v == ver[r]:
                heapq.heappush(heap, (t, r, v))
        while heap:
            t, r, v = heap[0]
            if v != ver[r]:
                heapq.heappop(heap)
                continue
            if tok[r] + need <= cap:
                return (t, r)
            heapq.heappop(heap)
            heapq.heappush(parked, (tok[r] - cap, r, v, t))
        return None

    def add(self, r: int, t: float, tokens: int, rate: float) -> None:
        self.load[r] += t
        self.tok[r] += tokens
        self.att[r] += t - rate * tokens
        self.ver[r] += 1
        self.load_np[r], self.tok_np[r] = self.load[r], self.tok[r]
        entry = (self.load[r], r, self.ver[r])
        if self.heap and self.heap[0][1] == r:  # the usual LPT case: the top entry itself grows
            heapq.heapreplace(self.heap, entry)
        else:
            heapq.heappush(self.heap, entry)

    def place_short(self, docs, length: np.ndarray, cost: np.ndarray, rate: float, owner: dict) -> int:
        """lpt.place_short for documents ``docs`` (visiting order; every one at most local_max tokens),
        recording their owners: how many were placed (it stops at one no rank has room for)."""
        load, tok = self.load_np, self.tok_np
        got, n = place_short(load, tok, length, cost, self.cap)
        att = np.array(self.att)
        np.add.at(att, got, cost[:n] - rate * length[:n])  # in visiting order, as one at a time
        # In place: the greedy holds these lists.
        self.load[:], self.tok[:], self.att[:] = load.tolist(), tok.tolist(), att.tolist()
        self.ver[:] = [v + 1 for v in self.ver]
        self.heap[:] = [(t, r, v) for r, (t, v) in enumerate(zip(self.load, self.ver))]
        heapq.heapify(self.heap)
        self.parked.clear()  # every rank is back in the load heap
        owner.update(zip(docs[:n], got.tolist()))
        return n

    def masker(self):
        """need -> loads as an array, +inf where ``need`` more tokens do not fit (read only: it may be
        the ranks' own array)."""
        load, tok = self.load_np, self.tok_np
        top = int(tok.max())

        def masked(need: int) -> np.ndarray:
            return load if top + need <= self.cap else np.where(tok + need <= self.cap, load, _INF)
        return masked


def _intra(ranks: _Ranks, g: int, sizes, member, need, ok, budget: float):
    """Best intra ring: (resulting max, G, members); the smallest G within ``budget`` if any."""
    best = (_INF, 0, ())
    masked = ranks.masker()
    whole = None  # each node's loads sorted, where no capacity binds (the usual case): one sort for every G
    for j in np.nonzero(ok)[0].tolist():
        G = int(sizes[j])
        m = masked(int(need[j]))
        if m is ranks.load_np:
            m = m.reshape(-1, g)
            if whole is None:
                whole = np.sort(m, axis=1)
            kth = whole[:, G - 1]  # per node: its G-th smallest load (np.partition's, the same value)
        else:
            m = m.reshape(-1, g)
            kth = np.partition(m, G - 1, axis=1)[:, G - 1]  # per node: its G-th smallest load
        v = int(np.argmin(kth))
        res = float(kth[v]) + float(member[j])
        if res == _INF or res >= best[0]:
            continue
        row = np.lexsort((np.arange(g), m[v]))[:G]  # G least-loaded of node v, ties by rank
        best = (res, G, tuple(sorted(int(v * g + x) for x in row)))
        if res <= budget:
            break
    return best


def _aligned(ranks: _Ranks, sizes, member, need, ok, budget: float, usable):
    """Best ring among aligned blocks (G a power of two with ``usable(G)``: ranks [kG, (k+1)G)), the
    block whose busiest member ends least loaded; the smallest G within ``budget`` if any."""
    best = (_INF, 0, ())
    masked = ranks.masker()
    for j in np.nonzero(ok)[0].tolist():
        G = int(sizes[j])
        if G & (G - 1) or not usable(G):
            continue
        top = masked(int(need[j])).reshape(-1, G).max(axis=1)  # [blocks]: the busiest member
        k = int(np.argmin(top))
        res = float(top[k]) + float(member[j])
        if res == _INF or res >= best[0]:
            continue
        best = (res, G, tuple(range(k * G, (k + 1) * G)))
        if res <= budget:
            break
    return best


def _intra_aligned(ranks: _Ranks, g: int, sizes, member, need, ok, budget: float):
    """Best intra ring among aligned blocks of one node. Aligned rings nest or are disjoint, so
    documents share few rings and a rank waits on few partners (free rings of overlapping members chain)."""
    return _aligned(ranks, sizes, member, need, ok, budget, lambda G: g % G == 0)


def _inter_aligned(ranks: _Ranks, g: int, sizes, member, need, ok, budget: float):
    """Best inter ring among aligned blocks of whole nodes (G above g, dividing the domain)."""
    world = len(ranks.load)
    return _aligned(ranks, sizes, member, need, ok, budget, lambda G: G > g and world % G == 0)


def _inter(ranks: _Ranks, g: int, sizes, member, need, ok, budget: float):
    """Best inter ring: the G least-loaded ranks of the domain, from the fewest nodes, node by node."""
    best = (_INF, 0, ())
    masked = ranks.masker()
    for j in np.nonzero(ok)[0].tolist():
        G = int(sizes[j])
        m = masked(int(need[j]))
        if G > len(m):
            break
        # numpy throughout (no Python sort keyed per rank): an inter ring's choice is O(world) per size,
        # and at 8,192 ranks the per-rank sorts were a tenth of planning.
        kth = float(np.partition(m, G - 1)[G - 1])  # the G-th least load
        res = kth + float(member[j])
        if res == _INF or res >= best[0]:
            continue
        elig = np.flatnonzero(m <= kth)
        count = np.bincount(elig // g, minlength=len(m) // g)
        rank_node = np.lexsort((np.arange(len(count)), -count))  # nodes by (-eligible ranks, node)
        pos = np.empty_like(rank_node)
        pos[rank_node] = np.arange(len(count))
        chosen = elig[np.lexsort((elig, m[elig], pos[elig // g]))[:G]].tolist()  # by (node's pos, load, rank)
        if len({r // g for r in chosen}) < 2:
            continue  # all in one node: the intra candidate is as good and cheaper
        best = (res, G, tuple(sorted(chosen)))  # node by node: rank order
        if res <= budget:
            break
    return best


# Budget scales tried in turn while the plan's estimate stays over GOOD x the lower bound: a lower
# target makes long documents take larger rings, which can leave fewer stranded ranks.
TARGETS = (1.0, 0.97, 0.94, 0.9, 0.85, 0.8)
GOOD = 1.01
# The aligned variant's loads count ring waiting, which the budget (whole work) does not, and a
# larger budget keeps documents on smaller rings, so it also tries scales above 1, up to no budget
# at all (each document whole on one rank if it fits, else on the smallest aligned ring that fits).
TARGETS_ALIGNED = (1.0, 1.3, 2.0, _INF)


# Variants planned and assembled; the one with the least honest prediction (predict.py: ring
# partners, routing proxies and remap partners wait for each other) is kept. (rate, inter, rings, remap):
# ``rate``: linear work per token in a rank's load ("all": projections + MLP + head; "proj": only the
# projections, which stay on the attention layout, the MLP being spread by a token-balanced remap);
# ``inter``: documents may span nodes by the crossover ("hide") or only when they fit no node
# ("forced": a routed inter ring couples every proxy of its nodes to its steps, and the local
# documents run inside the first exchange); ``rings``: a ring takes the least-loaded ranks ("free")
# or an aligned power-of-two block of consecutive ranks ("aligned", _intra_aligned and
# _inter_aligned: fewer rings that nest, so fewer partners to wait for when many documents are
# split, as under a tight capacity);
# ``remap``: the remap time-balances each node (node_time_targets), balances tokens, or is left out
# ("off": it is a synchronisation point every layer, so moving nothing can be faster).
NEAR_BOUND = 1.02  # a plan predicted within this of the lower bound ends the search (planning time)
VARIANTS = tuple((r, i, rings, m) for rings in ("free", "aligned") for r, i, m in (
    ("all", "hide", "time"), ("all", "forced", "time"), ("all", "hide", "off"), ("all", "forced", "off")))


@strategy(StrategyName.ZEPPELIN, order=0, searches=True)
def zeppelin_candidates(lengths: Sequence[int], ctx: PlanContext, search: Search, shapes: bool = True
                        ) -> Iterator[Candidate]:
    """Every variant worth assembling (strategies.pick keeps the lowest predicted iteration): the
    paper's partitioner (free rings), never cut, then ``_weighed``: its aligned-ring variants (the
    partitioner's too: never cut) and (``shapes``) the baselines' fixed shapes, within the search
    budget. A placement is computed once per (rate, inter) and prepared (layout, routed schedule,
    ring costs) once; its remap variants share that."""
    seen, memo = [], ({} if search.lengths is None else {"arrays": (search.lengths, search.whole_s)})
    placed, offs = {}, {}  # offs: each placement's remap-off candidate, its time variant is weighed against
    free = _placements_of("free", ctx)
    for k, (rate_kind, inter, rings, remap) in enumerate(VARIANTS):
        pk = (rate_kind, inter, rings)
        if pk not in free or (not ctx.config.remap and remap != "off"):
            continue  # aligned rings come in _weighed; --no-remap: the linear layout is the attention layout
        if pk not in placed:  # computed when first needed (the pick weighs the candidates before)
            placed[pk] = []
            try:
                passes = _choose(lengths, ctx, rate_kind, inter, rings, memo)
            except PlanError as e:  # no room for a document the greedy's way: the shapes may still fit
                yield Candidate(None, "/".join(pk), error=e)
                continue
            for chosen in passes:
                pl0 = _chosen_placement(chosen, ctx, memo, seen)
                if pl0 is None:
                    continue
                if search.budget is not None:  # the partitioner's own rings: recorded, not spent
                    topo = ctx.topology
                    search.budget.charge(placement_units(pl0, topo.world_size, topo.gpus_per_node, chunk_rows_of(ctx)))
                placed[pk].extend(_prepared(pl0, ctx))
        yield from _remap_variant(placed[pk], k, ctx, offs)
    if search.within(NEAR_BOUND):  # the free rings are near the lower bound: nothing else can gain much
        if search.budget is not None:
            search.budget.skipped("fixed shapes (near the lower bound)")
        return
    yield from _weighed(lengths, ctx, search, memo, seen, shapes)
    if search.best is None and shapes:
        yield _last_resort(lengths, ctx)


def _last_resort(lengths: Sequence[int], ctx: PlanContext) -> Candidate:
    """Where nothing fit (a batch packed to the capacity, as ``--zeppelin-accumulation rounds``
    packs them; too many documents per rank for the baselines' shapes to be weighed): dynamic_cp's
    groups at max_seqlen_per_dp_cp_rank = the capacity, which fit the batch that Megatron's
    scheduler packed (portfolio/shapes.py ``megatron_groups``)."""
    from dataclasses import replace as dc_replace
    label = f"dynamic_cp/{ctx.capacity}"
    try:
        pl0 = megatron_groups(lengths, ctx, ctx.capacity)
        pl0 = dc_replace(pl0, remap=False, balance_linear=False, routing=False, meta={**pl0.meta, "shape": label})
        return Candidate(pl0, f"{label}/off", prepared=prepare(ctx, pl0))
    except PlanError as e:
        return Candidate(None, label, error=e)


def _placements_of(rings: str, ctx: PlanContext):
    """The (rate, inter, rings) placements VARIANTS assemble with ``rings``, in their order."""
    out = []
    for rate_kind, inter, r, remap in VARIANTS:
        if r == rings and (rate_kind, inter, r) not in out and (ctx.config.remap or remap == "off"):
            out.append((rate_kind, inter, r))
    return out


def _chosen_placement(chosen, ctx: PlanContext, memo, seen):
    """The placement of one greedy pass (remap off), or None where an earlier pass gave the same one
    (no document near a threshold: equal dicts)."""
    if any(r is chosen[0] or (r == chosen[0] and o == chosen[1]) for r, o in seen):
        return None
    seen.append((chosen[0], chosen[1]))
    pl0 = _placement(memo["batch"][3], ctx, *chosen)  # the lengths as Python ints
    pl0.remap = False
    return pl0


def _prepared(pl0: Placement, ctx: PlanContext):
    """[(placement, prepared, label suffix)]: ``pl0`` and, where its intra rings run faster as
    Ulysses (ulysses_rings.py), that version too."""
    out = [(pl0, prepare(ctx, pl0), "")]
    ul = with_a2a_rings(pl0, ctx)
    if ul is not None:
        out.append((ul, prepare(ctx, ul), "+a2a"))
    return out


def _remap_variants(placed, pk, ctx: PlanContext, offs) -> Iterator[Candidate]:
    """The VARIANTS of placement kind ``pk`` (rate, inter, rings) of each prepared placement, in
    VARIANTS order."""
    for k, v in enumerate(VARIANTS):
        if v[:3] == pk and (ctx.config.remap or v[3] == "off"):  # --no-remap: only the off variants
            yield from _remap_variant(placed, k, ctx, offs)


def _remap_variant(placed, k: int, ctx: PlanContext, offs) -> Iterator[Candidate]:
    """VARIANTS[k] of each prepared placement; a free-ring time variant is weighed against its off
    variant (kept in ``offs`` until VARIANTS reaches it)."""
    from dataclasses import replace as dc_replace
    rate_kind, inter, rings, remap = VARIANTS[k]
    for pl0, pre, kind in placed:
        if remap == "off" and id(pl0) in offs:
            yield offs.pop(id(pl0))
            continue
        pl = dc_replace(pl0, remap=remap != "off", balance_linear=remap == "time", meta=dict(pl0.meta))
        versus = None
        if remap == "time" and rings == "free":  # its off variant comes later in VARIANTS for sure
            off = VARIANTS.index((rate_kind, inter, rings, "off"))
            versus = offs[id(pl0)] = Candidate(dc_replace(pl0, remap=False, balance_linear=False, meta=dict(pl0.meta)),
                                               "/".join(map(str, VARIANTS[off])) + kind, prepared=pre)
        yield Candidate(pl, "/".join(map(str, VARIANTS[k])) + kind, prepared=pre, versus=versus)


def _weighed(lengths, ctx: PlanContext, search: Search, memo, seen, shapes: bool) -> Iterator[Candidate]:
    """The candidates after the free rings: the aligned-ring variants first (the partitioner's own:
    recorded, never cut), then (``shapes``) the baselines' fixed shapes (portfolio/shapes.py, so that
    Zeppelin's prediction is never above theirs) cheapest first while the budget lasts, each whose
    lower bound can still win. A candidate that can win is worth weighing whatever it costs, so
    within a fixed budget the cheapest first weighs the
    most of them (by bound first, one costly routed shape could take the budget that a2a shapes
    several times cheaper needed). A bound at or above MEMORY_SLACK above the best so far cannot
    win: a shape up to that much slower may still be faster than the memory-balanced plan the pick
    takes instead (choice.py), which must then not be above it."""
    from dataclasses import replace as dc_replace
    budget = search.budget
    reach = (1 + MEMORY_SLACK) * search.best_s
    if budget is not None:
        budget.settle(search.best_s)  # the best after the partitioner sets the default budget
    world, g, rows = ctx.topology.world_size, ctx.topology.gpus_per_node, chunk_rows_of(ctx)
    aligned = []  # (units, order, bound, label, placement, aligned kind)
    for pk in _placements_of("aligned", ctx):
        try:
            passes = _choose(lengths, ctx, *pk, memo)
        except PlanError:  # as the free rings', noted there
            continue
        for chosen in passes:
            pl0 = _chosen_placement(chosen, ctx, memo, seen)
            if pl0 is None:
                continue
            name = f"{pk[0]}/{pk[1]}/{pk[2]}@{chosen[3]['target']}"
            bound = max(compute_bound(pl0, ctx), ring_chain_bound(pl0, ctx))
            aligned.append((placement_units(pl0, world, g, rows), len(aligned), bound, name, pl0, pk))
    pool = []  # (units, order, bound, label, placement): the fixed shapes, built within the budget
    if shapes:
        keys = set()
        for bound, label, pl0 in candidate_placements(lengths, ctx, reach, budget):
            key = placement_key(pl0)
            if key not in keys:
                keys.add(key)
                pool.append((placement_units(pl0, world, g, rows), len(pool), bound, label, pl0))

    def can_win(bound, label) -> bool:  # the best so far may have moved since the pool was built
        if bound < (1 + MEMORY_SLACK) * search.best_s:
            return True
        if budget is not None:
            budget.skipped(label)
        return False

    offs = {}
    for units, _, bound, label, pl0, pk in sorted(aligned, key=lambda c: (c[0], c[1])):  # the partitioner's: never cut
        if can_win(bound, label):
            if budget is not None:
                budget.charge(units)
            yield from _remap_variants(_prepared(pl0, ctx), pk, ctx, offs)
    for units, _, bound, label, pl0 in sorted(pool, key=lambda c: (c[0], c[1])):  # cheapest first
        if not can_win(bound, label) or (budget is not None and not budget.afford(label, units)):
            continue  # a cheaper candidate after it may still fit
        pre = prepare(ctx, pl0)
        off = Candidate(dc_replace(pl0, remap=False, balance_linear=False, meta=dict(pl0.meta)), f"{label}/off",
                        prepared=pre)
        if ctx.config.remap:  # time first (ties keep it), weighed against the off variant that follows
            pl = dc_replace(pl0, remap=True, balance_linear=True, meta=dict(pl0.meta))
            yield Candidate(pl, f"{label}/time", prepared=pre, versus=off)
        yield off


def plan_zeppelin(lengths: Sequence[int], ctx: PlanContext) -> Placement:
    """The winning placement, its ``meta['variant']`` naming the variant (the Plan itself:
    ``plan_batch(..., strategy="zeppelin")``)."""
    _, won = pick("zeppelin", lengths, ctx)
    return replace(won.placement, meta=dict(won.placement.meta, variant=won.label))


def _plan_variant(lengths, ctx: PlanContext, rate_kind: str, inter: str, remap: str, rings: str = "free") -> Placement:
    pl = _placement(list(map(int, lengths)), ctx, *_choose(lengths, ctx, rate_kind, inter, rings)[0])
    pl.remap = remap != "off"
    pl.balance_linear = remap == "time"
    return pl


def _choose(lengths, ctx: PlanContext, rate_kind: str, inter: str, rings: str = "free", memo=None):
    """The greedy's passes worth assembling: [(ring_of, owner, thresholds, meta)], the
    arguments of _placement. Free rings: the pass of least estimate. Aligned rings: every pass, as
    their loads charge ring waiting only roughly and the honest prediction picks among them.

    ``memo`` (one per plan_zeppelin call) keeps what the calls share: the batch's arrays (given as
    ``memo["arrays"]``: the lengths and each document's whole attention, where the pick has them) and
    thresholds, the ring tables per rate, and the "hide" passes in which no document spanned nodes
    by the hiding rule alone, which the "forced" pass of the same budget repeats exactly."""
    memo = {} if memo is None else memo
    cost = ctx.cost
    if "batch" not in memo:
        L, att_whole = memo.get("arrays") or (np.asarray(lengths, dtype=np.int64), None)
        att_whole = cost.doc_attention_np(L) if att_whole is None else att_whole
        order = np.lexsort((np.arange(len(L)), -L))  # (-length, index)
        memo["batch"] = (L, order, order.tolist(), L.tolist(), att_whole, zeppelin_thresholds(ctx))
    L, order, order_list, L_list, att_whole, th = memo["batch"]
    rate = cost.linear_s(1) if rate_kind == "all" else cost.proj_s(1)
    whole = att_whole + rate * L
    budget = float(whole.sum()) / ctx.topology.world_size
    tables = memo.setdefault(("tables", rate_kind), {})
    # The visiting order's tail of short documents (at most local_max tokens), as arrays (lpt.py).
    n_long = int(np.count_nonzero(L > th.local_max))
    short = (order_list[n_long:], L[order[n_long:]], whole[order[n_long:]])
    args = (ctx, L_list, whole.tolist(), order_list, n_long, short, th, rate, tables, inter == "forced",
            rings == "aligned")
    passes = []
    for f in (TARGETS_ALIGNED if rings == "aligned" else TARGETS):
        key = (rate_kind, rings, f)
        if inter == "forced" and key in memo:
            ring_of, owner, est = memo[key]
        else:
            ring_of, owner, est, spanned_by_hiding = _greedy(*args, budget * f)
            if inter == "hide" and not spanned_by_hiding:
                memo[key] = (ring_of, owner, est)
        passes.append((est, f, ring_of, owner))
        if est <= GOOD * budget:
            break
    passes.sort(key=lambda x: x[0])  # stable: ties keep the earlier target
    out = []
    for est, f, ring_of, owner in (passes if rings == "aligned" else passes[:1]):
        meta = {"budget_s": f"{budget:.6g}", "target": f"{f:g}", "estimate_s": f"{est:.6g}"}
        out.append((ring_of, owner, th, meta))
    return out


def _estimate(ranks: _Ranks, g: int) -> float:
    """Iteration estimate of a greedy result: the remap evens load out inside each node, so a
    node takes its mean load, or its largest attention (no rank gives up attention work)."""
    load = np.asarray(ranks.load).reshape(-1, g)
    att = np.asarray(ranks.att).reshape(-1, g)
    return float(np.maximum(load.mean(axis=1), att.max(axis=1)).max())


def _greedy(ctx: PlanContext, L_list, whole_list, order, n_long: int, short, th, rate: float, tables: dict,
            forced_only: bool, aligned: bool, budget: float):
    """One LPT pass (module docstring, step 2) with ``budget``: (ring_of, owner, estimate, whether a
    document took an inter ring that a ``forced_only`` pass would not have considered). The
    documents after ``order[:n_long]`` are short (``short``: them, their lengths and costs): each
    goes to the least-loaded rank with room, placed in batches (lpt.py) but for any that fits none."""
    topo = ctx.topology
    world, g, nodes = topo.world_size, topo.gpus_per_node, topo.nodes
    ranks = _Ranks(world, ctx.capacity)
    ring_of: Dict[int, Tuple[str, Tuple[int, ...]]] = {}
    owner: Dict[int, int] = {}
    intra_sizes = np.arange(2, g + 1)
    inter_sizes = np.arange(2, world + 1) if nodes > 1 else np.arange(0)
    local_max = th.local_max
    spanned_by_hiding = False
    todo = order[:n_long]
    for tail in (False, True):
        if tail:  # the short documents: in batches, then one at a time from one that fits no rank
            todo = order[n_long + ranks.place_short(*short, rate, owner):]
        for at, i in enumerate(todo):
            Li, ui = L_list[i], whole_list[i]
            loc = ranks.least_loaded(Li)
            loc_res = loc[0] + ui if loc else _INF
            if loc and (Li <= local_max or loc_res <= budget):
                owner[i] = loc[1]
                ranks.add(loc[1], ui, Li, rate)
                continue
            best = (loc_res, 1, (loc[1],) if loc else ())
            cls = DocClass.LOCAL
            forced = loc is None  # does not fit one rank whole: split whether or not steps hide
            if g >= 2:
                if (DocClass.INTRA, Li) not in tables:  # the same for every pass
                    # this and the next documents in visiting order (longest first) at once
                    ahead = [x for x in dict.fromkeys(L_list[j] for j in todo[at:at + _TABLES_AHEAD])
                             if (DocClass.INTRA, x) not in tables]
                    for x, row in zip(ahead, _ring_tables(ctx, ahead, intra_sizes, rate)):
                        tables[(DocClass.INTRA, x)] = row
                member, need, hide_nv, _, wait, _, _ = tables[(DocClass.INTRA, Li)]
                if aligned:  # the coarse variant also charges a ring's unhidden transfers
                    member = member + wait
                ok = hide_nv | forced
                if not ok.any():
                    ok = intra_sizes == 2
                cand = _intra_aligned(ranks, g, intra_sizes, member, need, ok, budget) if aligned else (_INF,)
                if cand[0] == _INF:  # free rings, or no aligned block fits
                    cand = _intra(ranks, g, intra_sizes, member, need, ok, budget)
                if cand[0] < best[0]:
                    best, cls = cand, DocClass.INTRA
            if (best[0] > budget or best[0] == _INF) and len(inter_sizes) and ((Li > th.intra_max and not forced_only) or best[0] == _INF):
                if (DocClass.INTER, Li) not in tables:
                    tables[(DocClass.INTER, Li)] = _ring_table(ctx, Li, inter_sizes, rate)
                member, need, _, hide_nic, _, wait, _ = tables[(DocClass.INTER, Li)]
                if aligned:
                    member = member + wait
                ok = hide_nic | (best[0] == _INF)
                cand = _inter_aligned(ranks, g, inter_sizes, member, need, ok, budget) if aligned else (_INF,)
                if cand[0] == _INF:
                    cand = _inter(ranks, g, inter_sizes, member, need, ok, budget)
                if cand[0] < best[0]:
                    spanned_by_hiding |= best[0] != _INF  # a forced_only pass keeps the intra/local form
                    best, cls = cand, DocClass.INTER
            if best[0] == _INF:
                raise PlanError(f"document {i} ({Li} tokens) fits no ranks with room (raise "
                                f"--zeppelin-capacity-tokens, now {ctx.capacity}, or add ranks)")
            if cls == DocClass.LOCAL:
                owner[i] = best[2][0]
                ranks.add(best[2][0], ui, Li, rate)
                continue
            members = best[2]
            G = len(members)
            b = zigzag_bounds(Li, G)
            m_att = float(tables[(cls, Li)][6][G - 2])  # == cost.ring_member_attention_s(Li, G)
            if aligned:  # its load counts the ring's waiting too, as its choice did
                m_att += float(tables[(cls, Li)][4 if cls == DocClass.INTRA else 5][G - 2])
            for k, r in enumerate(members):
                t = (b[k + 1] - b[k]) + (b[2 * G - k] - b[2 * G - 1 - k])
                ranks.add(r, m_att + rate * t, t, rate)
            ring_of[i] = (cls, members)
    return ring_of, owner, _estimate(ranks, g), spanned_by_hiding


def _new_doc(doc, length, cls, ring, owner, bounds, _new=object.__new__) -> DocPlan:
    """DocPlan(doc, length, cls, ring, owner, bounds) without the frozen dataclass's per-field
    __setattr__ (one per document of every placement: at 16k documents a tenth of planning); the
    fields are those of its __init__, so it equals, pickles and hashes the same.

    >>> _new_doc(3, 100, _LOCAL, -1, 2, (0, 100)) == DocPlan(3, 100, _LOCAL, -1, 2, (0, 100))
    True
    """
    d = _new(DocPlan)
    d.__dict__.update(doc=doc, length=length, cls=cls, ring=ring, owner=owner, bounds=bounds)
    return d


def _placement(lengths, ctx, ring_of, owner, th, meta) -> Placement:
    """Docs and rings; documents on the same ranks and class share one ring (in visiting order: the
    greedy fills ``ring_of`` in that order). ``lengths``: Python ints."""
    ring_id: Dict[Tuple[str, Tuple[int, ...]], int] = {}
    ring_docs: List[List[int]] = []
    for i, key in ring_of.items():
        if key not in ring_id:
            ring_id[key] = len(ring_docs)
            ring_docs.append([])
        ring_docs[ring_id[key]].append(i)
    rings = [Ring(id=k, ranks=key[1], cls=key[0], docs=tuple(ring_docs[k])) for key, k in ring_id.items()]
    get, local, new = owner.get, _LOCAL, _new_doc
    docs = [new(i, Li, local, -1, o, (0, Li)) if (o := get(i)) is not None else
            new(i, Li, ring_of[i][0], ring_id[ring_of[i]], -1, zigzag_bounds(Li, len(ring_of[i][1])))
            for i, Li in enumerate(lengths)]
    return Placement(docs=docs, rings=rings, thresholds=th, remap=ctx.config.remap,
                     routing=ctx.config.routing_enabled(ctx.topology.nodes), balance_linear=True, meta=meta,
                     local=[docs[i] for i in sorted(owner)])
