"""The layer program: what one attention layer computes and exchanges, derived from a Plan once.

The engine, the prediction and the simulator read the ring work from here instead of each
enumerating it: ``ring_blocks`` lists every (query chunk, key/value chunk) block each ring member
computes at each ring step (zigzag: member i at step s attends its chunks i and 2G-1-i to those of
member (i - s) mod G, causal: a kv chunk after the q chunk is skipped; all-gather rings use the
same blocks, step s = the block of member (i - s) mod G). An a2a (Ulysses) ring's member computes,
at step 0, every document whole and causal for its 1/G of the heads: one block per document of
``share`` 1/G (the FLOPs of the block times share; the kernel runs at the whole document's rate).
An a2a+p2p ring's member (P, j) (group P of ``Ring.a2a`` members, head group j) computes the
zigzag blocks of member P of the ring of groups over the super chunks (``super_bounds``), share 1/a.

Worked example: a 2-member ring over a document of 6 tokens cut (0, 1, 3, 4, 6): member 0 holds
chunks 0 and 3 (1 + 2 tokens), member 1 chunks 1 and 2 (2 + 1 tokens).

>>> from megatron_zeppelin.planner.types import DocPlan, Ring
>>> ring, doc = Ring(0, (0, 1), "intra", (0,)), DocPlan(0, 6, "intra", 0, -1, (0, 1, 3, 4, 6))
>>> ring_step_blocks(ring, {0: doc}, member=0, step=0)    # its own chunks: two diagonals, one full
[(1, 1, True), (2, 1, False), (2, 2, True)]
>>> ring_step_blocks(ring, {0: doc}, member=0, step=1)    # member 1's chunks: only chunk 3 x 1, 3 x 2
[(2, 2, False), (2, 1, False)]
>>> b = ring_blocks([ring], {0: doc})
>>> len(b.q), sorted(set(zip(b.member.tolist(), b.step.tolist())))
(10, [(0, 0), (0, 1), (1, 0), (1, 1)])
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from megatron_zeppelin.planner.types import CommOp, DocPlan, Ring, ring_documents
from megatron_zeppelin.spec.words import RING_QUEUES, STAGES, Comm, DocClass, Stage


def ring_step_blocks(ring: Ring, docs: Dict[int, DocPlan], member: int, step: int) -> List[Tuple[int, int, bool]]:
    """(q_len, kv_len, causal) blocks ``member`` computes at ``step`` (kv of member (i - s) mod G)."""
    g = ring.size
    kv_member = (member - step) % g
    out = []
    for d in ring.docs:
        b = docs[d].bounds
        for qa in (member, 2 * g - 1 - member):
            for kb in (kv_member, 2 * g - 1 - kv_member):
                q, k = b[qa + 1] - b[qa], b[kb + 1] - b[kb]
                if q and k and kb <= qa:
                    out.append((q, k, kb == qa))
    return out


def hier_p2p_size(ring: Ring) -> int:
    """The ring of groups of an a2a+p2p ring: size / a2a members (TE's p2p cp_group)."""
    a = ring.a2a
    if a < 2 or ring.size % a or ring.size // a < 2:
        raise ValueError(f"a2a+p2p ring {ring.id} of {ring.size} ranks needs groups of 2 <= a2a < size "
                         f"dividing it, got a2a={a}")
    return ring.size // a


def super_bounds(bounds: Sequence[int], a: int) -> Tuple[int, ...]:
    """A document's zigzag bounds over 2*G chunks, cut at every ``a``-th: the 2*(G/a) super chunks
    of the ring of a2a groups (TE's reorder after the a2a puts them in this order).

    >>> super_bounds((0, 1, 2, 3, 4, 5, 6, 7, 8), 2)
    (0, 2, 4, 6, 8)
    """
    return tuple(bounds[::a])


@dataclass(frozen=True)
class RingBlocks:
    """Every block of some rings, as parallel arrays (one entry per block)."""
    q: np.ndarray
    kv: np.ndarray
    causal: np.ndarray
    ring: np.ndarray  # index into the rings given
    member: np.ndarray
    step: np.ndarray
    rank: np.ndarray  # the member's rank
    seq: np.ndarray  # the block's query chunk (ring, document, chunk), an id: blocks of one query chunk in
    # one kernel call are one sequence of it (attention/kernels/pieces.py), which pays cost.seq_s once
    share: np.ndarray  # the share of the heads it computes: 1, 1/G on an a2a ring of G members, 1/a on an
    # a2a+p2p ring of a2a groups of a


@lru_cache(maxsize=None)
def _ring_grid(g: int) -> Tuple[np.ndarray, ...]:
    """The (step, member, q chunk, kv chunk) grid of a zigzag ring of ``g`` members, in (step,
    member, q chunk, kv chunk) order, causal pairs only (kv chunk <= q chunk): (step, member, q
    chunk, kv chunk, diagonal) as flat arrays. The same for every ring of that size: built once."""
    s = np.arange(g)[:, None]
    i = np.broadcast_to(np.arange(g)[None, :], (g, g))
    j = (i - s) % g  # kv member of member i at step s
    shape = (g, g, 2, 2)
    qa = np.broadcast_to(np.stack([i, 2 * g - 1 - i], -1)[:, :, :, None], shape)
    kb = np.broadcast_to(np.stack([j, 2 * g - 1 - j], -1)[:, :, None, :], shape)
    keep = kb <= qa
    step = np.broadcast_to(np.arange(g)[:, None, None, None], shape)[keep]
    member = np.broadcast_to(np.arange(g)[None, :, None, None], shape)[keep]
    out = (step, member, qa[keep], kb[keep], (kb == qa)[keep])
    for a in out:  # shared by every call (cached): read only
        a.setflags(write=False)
    return out


def ring_blocks(rings: Sequence[Ring], docs: Dict[int, DocPlan]) -> RingBlocks:
    """Every block of ``rings``, in (ring, step, member, document, q chunk, kv chunk) order: the
    blocks ``ring_step_blocks`` lists, built with numpy one ring size at a time (a ring of G
    members over D documents has up to 4 G^2 D blocks: hundreds of thousands for a CP 32 ring)."""
    by_size: Dict[int, List[int]] = {}
    a2a: List[int] = []
    hier: List[int] = []
    for ri, r in enumerate(rings):
        if r.docs and r.size:
            (a2a if r.comm == Comm.A2A else hier if r.comm == Comm.A2A_P2P else by_size.setdefault(r.size, [])
             ).append(ri)
    parts = []
    top = max([rings[ri].size for ri in a2a + hier] + list(by_size), default=0) + 1
    pairs_before = 0  # (ring, document) pairs of the earlier sizes: seq ids stay distinct across sizes
    for g, ris in by_size.items():
        # One row per (ring, document) pair, rings in order, each ring's documents in order.
        pair_ring = np.array([ri for ri in ris for _ in rings[ri].docs], dtype=np.int64)
        chunk = np.diff(np.array([docs[d].bounds for ri in ris for d in rings[ri].docs], dtype=np.int64), axis=1)
        ranks = np.array([rings[ri].ranks for ri in ris], dtype=np.int64)  # [R, G]
        slot = np.repeat(np.arange(len(ris)), [len(rings[ri].docs) for ri in ris])  # pair -> row of ranks
        step, member, qa, kb, diag = _ring_grid(g)
        q, k = chunk[:, qa], chunk[:, kb]  # [pairs, grid]: pair-major, as the order above
        keep = (q > 0) & (k > 0)
        pair, at = np.nonzero(keep)
        member = member[at]
        seq = (pairs_before + pair) * (2 * top) + qa[at]
        parts.append((q[keep], k[keep], diag[at], pair_ring[pair], member, step[at], ranks[slot[pair], member], seq,
                      np.ones(len(pair))))
        pairs_before += len(pair_ring)
    for ri in a2a:  # every member: each document whole, causal, its head group (one sequence each)
        r = rings[ri]
        g, lengths = r.size, np.array([docs[d].length for d in r.docs], dtype=np.int64)
        member = np.repeat(np.arange(g), len(lengths))
        L = np.tile(lengths, g)
        pair = pairs_before + np.tile(np.arange(len(lengths)), g)
        keep = L > 0
        parts.append((L[keep], L[keep], np.ones(keep.sum(), dtype=bool), np.full(keep.sum(), ri), member[keep],
                      np.zeros(keep.sum(), dtype=np.int64), np.array(r.ranks, dtype=np.int64)[member[keep]],
                      (pair * (2 * top) + member)[keep], np.full(keep.sum(), 1.0 / g)))
        pairs_before += len(lengths)
    for ri in hier:  # member (P, j): the zigzag ring of groups over super chunks, head group j's share
        r = rings[ri]
        a, p = r.a2a, hier_p2p_size(r)
        chunk = np.diff(np.array([super_bounds(docs[d].bounds, a) for d in r.docs], dtype=np.int64), axis=1)
        step, group, qa, kb, diag = _ring_grid(p)
        q, k = chunk[:, qa], chunk[:, kb]
        keep = (q > 0) & (k > 0)
        doc, at = np.nonzero(keep)
        ranks = np.array(r.ranks, dtype=np.int64)
        for j in range(a):
            member = group[at] * a + j
            parts.append((q[keep], k[keep], diag[at], np.full(len(at), ri), member, step[at], ranks[member],
                          (pairs_before + doc * a + j) * (2 * top) + qa[at], np.full(len(at), 1.0 / a)))
        pairs_before += len(r.docs) * a
    f, n, b = np.float64, np.int64, bool
    if not parts:
        e = np.zeros(0)
        return RingBlocks(e, e.copy(), e.astype(b), e.astype(n), e.astype(n), e.astype(n), e.astype(n), e.astype(n),
                          e.copy())
    q, kv, c, ri, i, st, rank, seq, sh = (np.concatenate(x) for x in zip(*parts))
    order = np.argsort((ri * top + st) * top + i, kind="stable")  # (ring, step, member); documents stay in order
    return RingBlocks(q[order].astype(f), kv[order].astype(f), c[order].astype(b), ri[order].astype(n),
                      i[order].astype(n), st[order].astype(n), rank[order].astype(n), seq[order].astype(n),
                      sh[order].astype(f))


def sequences_per(keys: np.ndarray, seq: np.ndarray, causal: np.ndarray, size: int) -> np.ndarray:
    """Kernel sequences per ``key`` (an index < size) among the blocks given: one per distinct
    ``seq`` (query chunk), and one more for each that mixes full and causal blocks: such a sequence
    (full keys, then a causal run: bottom-right causal with more keys than queries) runs as two
    calls and a merge on the CPU kernel (attention/kernels/cpu.py); GPU profiles have no
    per-sequence cost, so the count does not matter there.

    >>> sequences_per(np.array([0, 0, 0, 2]), np.array([5, 5, 6, 5]), np.array([True, False, True, False]), 3).tolist()
    [3, 0, 1]
    """
    if not len(keys):
        return np.zeros(size, dtype=np.int64)
    top = int(seq.max()) + 1
    ks = keys.astype(np.int64) * top + seq
    return np.bincount(np.unique(ks) // top, minlength=size) + splits_per(keys, seq, causal, None, size)[0]


def splits_per(keys: np.ndarray, seq: np.ndarray, causal: np.ndarray, q: Optional[np.ndarray], size: int):
    """(split sequences, their query rows) per ``key`` (an index < size) among the blocks given:
    the sequences mixing full and causal blocks (``sequences_per`` counts each twice), which
    a shared CPU host's ``split_s`` prices (spec/host.py); rows 0 where ``q`` (each block's query rows) is None.

    >>> n, rows = splits_per(np.array([0, 0, 0, 2]), np.array([5, 5, 6, 5]), np.array([True, False, True, False]),
    ...                      np.array([7.0, 7.0, 3.0, 7.0]), 3)
    >>> n.tolist(), rows.tolist()
    ([1, 0, 0], [7.0, 0.0, 0.0])
    """
    if not len(keys):
        return np.zeros(size, dtype=np.int64), np.zeros(size)
    top = int(seq.max()) + 1
    ks = keys.astype(np.int64) * top + seq
    both, first, _ = np.intersect1d(ks[causal], ks[~causal], return_indices=True)
    at = both // top
    rows = np.zeros(size) if q is None else np.bincount(at, q[causal][first], minlength=size)
    return np.bincount(at, minlength=size), rows


def call_blocks_s(cost, q, kv, causal, share, seq, backward: bool = False) -> np.ndarray:
    """Seconds of the FLOPs of the blocks of one kernel call (arrays, one entry per block; ``seq``:
    each block's query chunk, so the call's blocks of one query chunk are one sequence, as the
    engine packs them: attention/kernels/pieces.py), as the call runs them: each block at the rate
    of its sequence, the table of the sequence's mask (causal where it ends in a causal run, else
    full) at its keys (``cost.block_flops_s``; a profile priced per block reads each block alone).

    A zigzag member's later chunk of c rows at a step past its own holds two full c x c blocks:
    one sequence of 2c keys, at the full table's rate at 2c.

    >>> from dataclasses import replace
    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> c = toy_context().cost
    >>> c = replace(c, profile=replace(c.profile, attn_by_sequence=True))
    >>> two = call_blocks_s(c, np.array([600., 600.]), np.array([600., 600.]), np.array([False, False]), 1.0,
    ...                     np.array([7, 7]))
    >>> bool(abs(two.sum() - c.block_flops_s(600, 1200, False)) < 1e-15), bool(two[0] <= c.block_flops_s(600, 600, False))
    (True, True)
    """
    if not cost.profile.attn_by_sequence or not len(q):
        return cost.block_flops_s(q, kv, causal, backward) * share
    _, at = np.unique(seq, return_inverse=True)
    keys = np.bincount(at, kv)[at]
    masked = np.bincount(at, causal.astype(np.float64))[at] > 0
    return cost.block_flops_s(q, kv, causal, backward, keys=keys, masked=masked) * share


def ring_step_costs(cost, rings: Sequence[Ring], docs: Dict[int, DocPlan], steps: int, world: int):
    """Per ring step and rank, (forward, backward) compute seconds of one layer of ``rings``, as
    [steps, world] arrays: the blocks' FLOPs by the cost model's one block function (each at its
    sequence's rate: ``call_blocks_s``), a fixed
    ``cost.seq_s`` per sequence (query chunk) and one kernel call (``cost.call_s``) per (step, rank)
    with blocks, as the engine packs a step's blocks."""
    b = ring_blocks(rings, docs)
    fwd, bwd = np.zeros((steps, world)), np.zeros((steps, world))
    if len(b.q):
        call = b.seq * steps + b.step  # a query chunk's blocks of one step: one sequence of that step's call
        np.add.at(fwd, (b.step, b.rank), call_blocks_s(cost, b.q, b.kv, b.causal, b.share, call))
        np.add.at(bwd, (b.step, b.rank), call_blocks_s(cost, b.q, b.kv, b.causal, b.share, call, True))
        n = sequences_per(b.step * world + b.rank, b.seq, b.causal, steps * world).reshape(steps, world)
        has = n > 0
        fwd += has * cost.call_s() + n * cost.seq_s()
        bwd += has * cost.call_s(True) + n * cost.seq_s(True)
        host = cost.host
        if host is not None:  # a shared CPU host's kernel merges its split sequences (spec/host.py)
            ns, rows = (x.reshape(steps, world) for x in splits_per(b.step * world + b.rank, b.seq, b.causal, b.q,
                                                                    steps * world))
            fwd += host.split_s(ns, rows)
            bwd += host.split_s(ns, rows, True)
    return fwd, bwd


# --- the program of one layer's core attention --------------------------------------------------
def exchange_phases(stages: Sequence[str] = STAGES, reverse: bool = False) -> Tuple[Stage, ...]:
    """The phases of one exchange in the order its hops run, named as the paper names them:
    ``dispatch`` (NVLink, the source GPU to the proxies of its node), ``transfer`` (one piece per
    NIC, to a proxy at the destination node), ``combine`` (NVLink, to the destination); a ``direct``
    hop starts with the first. ``reverse`` (gradients going home over the mirrored hops): the other
    way round. Only the phases among ``stages`` (those an exchange's ops use).

    >>> exchange_phases(), exchange_phases(("direct", "combine", "dispatch"), reverse=True)
    (('direct', 'dispatch', 'transfer', 'combine'), ('combine', 'dispatch', 'direct'))
    """
    order = tuple(reversed(STAGES)) if reverse else STAGES
    return tuple(s for s in order if s in stages)


# --- the routed step: pieces cut into chunks, relayed as a pipeline ------------------------------
def chunk_cuts(start: int, stop: int, per_row: int, chunk_bytes: int) -> List[Tuple[int, int]]:
    """Rows [start, stop) of a routed piece cut into chunks of at most ``chunk_bytes`` (``per_row``
    bytes a row; at least one row a chunk), as even as rows allow (the first ones a row longer), so
    every stage of the piece cuts it the same way; ``chunk_bytes`` 0: one chunk (unpipelined).

    >>> chunk_cuts(0, 10, 8, 24), chunk_cuts(5, 7, 8, 0), chunk_cuts(0, 3, 8, 1), chunk_cuts(0, 37, 128, 1000)
    ([(0, 3), (3, 6), (6, 8), (8, 10)], [(5, 7)], [(0, 1), (1, 2), (2, 3)], [(0, 7), (7, 13), (13, 19), (19, 25), (25, 31), (31, 37)])
    """
    rows = stop - start
    if chunk_bytes <= 0 or rows * per_row <= chunk_bytes or rows <= 1:
        return [(start, stop)]
    n = -(-rows // max(1, chunk_bytes // max(1, per_row)))  # chunks of at most that many whole rows
    base, extra = divmod(rows, n)
    out, a = [], start
    for i in range(n):
        b = a + base + (i < extra)
        out.append((a, b))
        a = b
    return out


def _chunk_groups(hops: Sequence[Tuple]) -> Tuple[List[int], Dict[Tuple, List[int]]]:
    """(each hop's chunk index, the hops of each piece on each hop: (message, stage, src, dst) ->
    indices as given), ``hops`` as ``step_order`` reads them."""
    chunk = [0] * len(hops)
    groups: Dict[Tuple, List[int]] = {}
    for i, h in enumerate(hops):
        groups.setdefault((h[3], h[0], h[1], h[2]), []).append(i)
    start = None
    for idx in groups.values():
        if len(idx) > 1:  # a stable sort of ascending indices: by rows, then as given
            if start is None:
                start = [h[4] for h in hops]
            for c, i in enumerate(sorted(idx, key=start.__getitem__)):
                chunk[i] = c
    return chunk, groups


def step_chunks(hops: Sequence[Tuple]) -> List[int]:
    """Each hop's chunk index as ``step_order`` numbers them (``hops`` as it reads them): the
    chunks of one piece on one hop (same message, stage, src, dst) by rows, then as given; for
    a caller that needs only the chunks (the load of an exchange in flight with another).

    >>> step_chunks([("dispatch", 0, 1, "m", 5, 9, False), ("dispatch", 0, 1, "m", 0, 5, False), ("transfer", 1, 3, "m", 0, 9, True)])
    [1, 0, 0]
    """
    return _chunk_groups(hops)[0]


def step_feeds(hops: Sequence[Tuple]) -> List[Optional[List[int]]]:
    """Per relayed hop (``hops`` as ``step_order`` reads them), the hops whose rows arrive at its
    sender and contain its own rows [start, stop), in the order given (the relay forwards them once
    they are there); None for a hop that is not relayed. Chunked pieces arrive at a rank as
    disjoint ranges in row order and a relay forwards exactly a range that arrived, so that range
    answers at once; only otherwise (overlaps, empty rows, a sub-range) are all the message's
    arrivals at the rank scanned (quadratic in a message's chunks: it was most of a routed plan's
    preparation).

    >>> step_feeds([("dispatch", 0, 1, "m", 0, 5, False), ("dispatch", 0, 1, "m", 5, 9, False),
    ...             ("transfer", 1, 3, "m", 5, 9, True), ("transfer", 1, 3, "m", 6, 8, True)])
    [None, None, [1], [1]]
    """
    at: Dict[Tuple, List[int]] = {}  # (message, rank) -> the hops arriving there
    for i, h in enumerate(hops):
        at.setdefault((h[3], h[2]), []).append(i)
    exact: Dict[Tuple, Optional[Dict]] = {}  # (message, rank) -> rows -> hop, where disjoint in row order
    out: List[Optional[List[int]]] = [None] * len(hops)
    for i, h in enumerate(hops):
        if not h[6]:
            continue
        key, a, b = (h[3], h[1]), h[4], h[5]
        came = at.get(key)
        if came is None:
            out[i] = []
            continue
        if key not in exact:
            top, rows = None, {}
            for j in came:
                a0, b0 = hops[j][4], hops[j][5]
                if not a0 < b0 or (top is not None and a0 < top):
                    rows = None
                    break
                rows[(a0, b0)], top = j, b0
            exact[key] = rows
        rows = exact[key]
        j = None if rows is None or not a < b else rows.get((a, b))
        out[i] = [j] if j is not None else [j for j in came if hops[j][4] <= a and b <= hops[j][5]]
    return out


def step_order(hops: Sequence[Tuple], reverse: bool = False) -> Tuple[List[int], List[int]]:
    """The order in which one exchange's hops run, and each hop's chunk index: the one order the
    executor posts them in (distributed/executor.py), the prediction times them in
    (planner/cost/predict.py ``_exchange``) and the simulator adds their flows in (sim/executor.py).

    ``hops``: (stage, src, dst, message, start, stop, relayed) each; ``message`` tells messages apart
    (it includes the message's source and destination), ``relayed``: ``src`` is not the message's
    source (a proxy forwards rows that arrived). The chunks of one piece on one hop (same message,
    stage, src, dst) are numbered by rows. A hop's *wave*: a first hop's is its chunk + its phase's
    index (exchange_phases); a relayed hop's is that too, but at least one more than the hop that
    brought its rows. Hops run by wave, then phase, then as given: chunk i+1's dispatch goes with
    chunk i's transfer and chunk i-1's combine (a pipeline), and every relay forwards only what an
    earlier wave brought, so relays never wait on one another in a cycle. Unchunked (every chunk 0)
    this is phase order, then as given. Returns (indices in that order, chunk index per hop).

    Worked example: one piece of 2 chunks, dispatched 0 -> 1, sent 1 -> 3.

    >>> hops = [("dispatch", 0, 1, "m", 0, 5, False), ("dispatch", 0, 1, "m", 5, 9, False),
    ...         ("transfer", 1, 3, "m", 0, 5, True), ("transfer", 1, 3, "m", 5, 9, True)]
    >>> step_order(hops)   # waves: dispatch c0 | dispatch c1, transfer c0 | transfer c1
    ([0, 1, 2, 3], [0, 1, 0, 1])
    """
    order, chunk, _, _ = step_schedule(hops, reverse)
    return order, chunk


def step_schedule(hops: Sequence[Tuple], reverse: bool = False):
    """``step_order``'s (order, chunks), with what it finds on the way for a caller that times the
    hops (planner/cost/predict.py): the chunk groups ((message, stage, src, dst) -> hop indices as
    given) and ``step_feeds``."""
    phase = {st: j for j, st in enumerate(exchange_phases(reverse=reverse))}
    ph = [phase[h[0]] for h in hops]
    chunk, groups = _chunk_groups(hops)
    feeds = step_feeds(hops)
    wave = [c + p for c, p in zip(chunk, ph)]
    relayed = [i for i, came in enumerate(feeds) if came]
    for i in sorted(relayed, key=ph.__getitem__):  # by phase, then as given (a stable sort)
        w, p = wave[i], ph[i]
        for j in feeds[i]:  # at least one more than each hop that brought its rows before it
            if (ph[j] < p or (ph[j] == p and j < i)) and wave[j] >= w:
                w = wave[j] + 1
        wave[i] = w
    n = len(phase)  # (wave, phase) as one integer: phase < n (stable again: then as given)
    key = [w * n + p for w, p in zip(wave, ph)]
    order = sorted(range(len(hops)), key=key.__getitem__)
    return order, chunk, groups, feeds



@dataclass(frozen=True)
class Compute:
    """Attention kernels on every rank: the blocks of ``rings`` (ids) at the ring ``steps`` (the
    ring step s of a member: the K/V block of member (i - s) mod G; all-gather: step 0 is the own
    block); ``queue`` ``local``: the local documents."""
    queue: str
    rings: Tuple[int, ...] = ()
    steps: Tuple[int, ...] = ()

    def __str__(self) -> str:
        return f"compute {self.queue}" + (f" rings {list(self.rings)} steps {list(self.steps)}" if self.rings else "")


@dataclass(frozen=True)
class Post:
    """Start an exchange (every rank posts it): the Plan's CommOps of (``queue``, ``step``) of
    ``rings``; ``reverse``: mirrored (partial dK/dV home). ``shares``: exchanges in flight with it
    on the same links (named by ``name``), for a model that times exchanges one by one.
    ``phases``: the routing phases its ops run, in order (exchange_phases; known when the program
    is made with the Plan's schedule)."""
    name: str
    queue: str
    step: int
    rings: Tuple[int, ...]
    reverse: bool = False
    shares: Tuple[str, ...] = ()
    phases: Tuple[str, ...] = ()

    def __str__(self) -> str:
        routed = [p for p in self.phases if p != Stage.DIRECT]
        return (f"post {self.name}: ops of ({self.queue}, step {self.step}) of rings {list(self.rings)}"
                + (" reversed" if self.reverse else "") + (f", sharing links with {', '.join(self.shares)}" if self.shares else "")
                + (f", in {' -> '.join(self.phases)}" if routed else ""))


@dataclass(frozen=True)
class Wait:
    """Every rank waits for its part of the exchange ``name``."""
    name: str

    def __str__(self) -> str:
        return f"wait {self.name}"


def attention_program(rings: Sequence[Ring], has_local: bool, backward: bool,
                      schedule: Optional[Sequence[CommOp]] = None) -> List[object]:
    """The ordered program of one layer's core attention, forward or backward, as the engine runs
    it (attention/engine.py runs it with attention/runner.py); the prediction and the simulator
    interpret it too.

    Queues inter, then intra; in a queue the a2a rings, the a2a+p2p rings (``hier_section``), the
    all-gather rings, then the zigzag (p2p) rings, all rings of a queue stepping together. The *overlap point* is right after the first compute of
    each queue (ring kind): the first runs the local documents (inside the layer's first
    exchange); in the backward later ones wait for the previous queue's last dK/dV exchange.
    - zigzag forward: step s posts its K/V exchange (rings with s < G-1), computes, waits.
    - zigzag backward (ring-flash-attention): step s posts its K/V exchange, computes (step s-1's
      dK/dV in flight), waits for that dK/dV, posts step s's dK/dV (rings with s < G), waits for
      the K/V; step G-1's dK/dV is waited at the next overlap point (or at the end).
    - a2a (Ulysses, TE's AttnFuncWithCPAndQKVOA2A): forward posts Q/K/V to the head groups (step
      0), waits, computes every document for its heads, posts the output home (step 1), waited at
      the next overlap point; backward the same with dO (step 1 mirrored) and dQ/dK/dV home (step
      0 mirrored).
    - all-gather: gather; forward computes its own block meanwhile, the rest after; backward
      computes the other blocks, posts their partial dK/dV home (reversed ops), computes its own
      block, and waits for the partials at the next overlap point.
    With the Plan's ``schedule``, each Post names its routing phases (dispatch -> transfer ->
    combine where its messages are routed; exchange_phases).

    Worked example: one 2-member intra ring, backward.

    >>> for x in attention_program([Ring(0, (0, 1), "intra", (0,))], has_local=True, backward=True):
    ...     print(x)
    post kv intra 0: ops of (intra, step 0) of rings [0]
    compute intra rings [0] steps [0]
    compute local
    post dkv intra 0: ops of (intra, step 0) of rings [0]
    wait kv intra 0
    compute intra rings [0] steps [1]
    wait dkv intra 0
    post dkv intra 1: ops of (intra, step 1) of rings [0]
    wait dkv intra 1
    """
    prog: List[object] = []
    pending: List[object] = [True]  # True: the local documents; a name: an exchange waited at the next point
    stages: Dict[Tuple[str, int, int], set] = {}  # (queue, step, ring) -> the stages of its ops
    for o in schedule or ():
        stages.setdefault((o.queue, o.step, o.ring), set()).add(o.stage)

    def post(name, queue, step, rs, reverse=False, shares=()) -> Post:  # with the phases its ops run
        used = set().union(*(stages.get((queue, step, r), set()) for r in rs))
        return Post(name, queue, step, rs, reverse, shares, exchange_phases(used, reverse) if used else ())

    def overlap_point():
        p = pending[0]
        if isinstance(p, str):
            prog.append(Wait(p))
        elif p and has_local:
            prog.append(Compute(DocClass.LOCAL))
        pending[0] = None

    for queue in RING_QUEUES:
        qr = [r for r in rings if r.cls == queue]
        a2a = tuple(r.id for r in qr if r.comm == Comm.A2A)
        if a2a:  # Ulysses: heads in (step 0's ops; backward dO, step 1's mirrored), compute, heads back
            first, then = (("dout", 1), ("dqkv", 0)) if backward else (("qkv", 0), ("out", 1))
            prog.append(post(f"{first[0]} {queue}", queue, first[1], a2a, reverse=backward))
            overlap_point()
            prog += [Wait(f"{first[0]} {queue}"), Compute(queue, a2a, (0,)),
                     post(f"{then[0]} {queue}", queue, then[1], a2a, reverse=backward)]
            pending[0] = f"{then[0]} {queue}"
        for p in sorted({hier_p2p_size(r) for r in qr if r.comm == Comm.A2A_P2P}):
            hier_section(prog, post, overlap_point, pending, queue, p,
                         tuple(r.id for r in qr if r.comm == Comm.A2A_P2P and hier_p2p_size(r) == p), backward)
        ag = tuple(r.id for r in qr if r.comm == Comm.ALLGATHER)
        if ag:
            size = max(r.size for r in qr if r.comm == Comm.ALLGATHER)
            gather = f"gather {queue}"
            prog.append(post(gather, queue, 0, ag))
            if not backward:
                prog.append(Compute(queue, ag, (0,)))
            overlap_point()
            prog.append(Wait(gather))
            if not backward:
                prog.append(Compute(queue, ag, tuple(range(1, size))))
            else:
                prog.append(Compute(queue, ag, tuple(range(1, size))))
                prog += [post(f"scatter {queue}", queue, 0, ag, reverse=True), Compute(queue, ag, (0,))]
                pending[0] = f"scatter {queue}"
        p2p = [r for r in qr if r.comm == Comm.P2P]
        if not p2p:
            continue
        steps = max(r.size for r in p2p)
        dkv = None  # backward: the dK/dV exchange of the previous step, in flight
        for s in range(steps):
            kv_rings = tuple(r.id for r in p2p if s < r.size - 1)
            kv = f"kv {queue} {s}" if kv_rings else None
            if kv:
                prog.append(post(kv, queue, s, kv_rings, shares=(dkv,) if dkv else ()))
            prog.append(Compute(queue, tuple(r.id for r in p2p if s < r.size), (s,)))
            overlap_point()
            if backward:
                if dkv:
                    prog.append(Wait(dkv))
                nxt = f"kv {queue} {s + 1}" if any(s + 1 < r.size - 1 for r in p2p) else None
                dkv = f"dkv {queue} {s}"
                prog.append(post(dkv, queue, s, tuple(r.id for r in p2p if s < r.size),
                                 shares=(nxt,) if nxt else ()))
            if kv:
                prog.append(Wait(kv))
        if backward:
            pending[0] = dkv
    overlap_point()
    return prog


def hier_section(prog: List[object], post, overlap_point, pending: List[object], queue: str, p: int,
                 rings: Tuple[int, ...], backward: bool) -> None:
    """The a2a+p2p rings of ``queue`` whose rings of groups have ``p`` members (TE's
    AttnFuncWithCPAndKVP2P with cp_group = [a2a, p2p]): forward, Q/K/V to the head groups inside
    each a2a group (step p), the zigzag ring of the groups' super blocks (steps 0..p-1, as a p2p
    ring of p), the output home (step p + 1, waited at the next overlap point); backward, dO in
    (step p + 1 mirrored), the zigzag backward ring, its last dK/dV waited (the own super block's,
    home before the all-to-all), then dQ/dK/dV home (step p mirrored). Post names carry ``p``.

    >>> prog = []
    >>> hier_section(prog, lambda n, q, s, rs, reverse=False, shares=(): Post(n, q, s, rs, reverse, shares),
    ...              lambda: None, [None], "inter", 2, (0,), backward=False)
    >>> for x in prog: print(x)
    post hqkv inter 2: ops of (inter, step 2) of rings [0]
    wait hqkv inter 2
    post hkv inter 2 0: ops of (inter, step 0) of rings [0]
    compute inter rings [0] steps [0]
    wait hkv inter 2 0
    compute inter rings [0] steps [1]
    post hout inter 2: ops of (inter, step 3) of rings [0]
    """
    first, then = (("hdout", p + 1), ("hdqkv", p)) if backward else (("hqkv", p), ("hout", p + 1))
    name = f"{first[0]} {queue} {p}"
    prog.append(post(name, queue, first[1], rings, reverse=backward))
    overlap_point()
    prog.append(Wait(name))
    dkv = None
    for s in range(p):
        kv = f"hkv {queue} {p} {s}" if s < p - 1 else None
        if kv:
            prog.append(post(kv, queue, s, rings, shares=(dkv,) if dkv else ()))
        prog.append(Compute(queue, rings, (s,)))
        if backward:
            if dkv:
                prog.append(Wait(dkv))
            nxt = f"hkv {queue} {p} {s + 1}" if s + 1 < p - 1 else None
            dkv = f"hdkv {queue} {p} {s}"
            prog.append(post(dkv, queue, s, rings, shares=(nxt,) if nxt else ()))
        if kv:
            prog.append(Wait(kv))
    if backward:
        prog.append(Wait(dkv))
    prog.append(post(f"{then[0]} {queue} {p}", queue, then[1], rings, reverse=backward))
    pending[0] = f"{then[0]} {queue} {p}"


_OWNER, _LENGTH = attrgetter("owner"), attrgetter("length")


def local_arrays(docs: Sequence[DocPlan], local: Optional[Sequence[DocPlan]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """(owners, lengths as floats) of the local documents in document order; ``local``: those
    documents, where the caller has them (the attention tokens and the compute both read them)."""
    if local is None:
        cls = DocClass.LOCAL  # bound once per call (spec/words.py)
        local = [d for d in docs if d.cls == cls]
    n = len(local)
    return (np.fromiter(map(_OWNER, local), dtype=np.int64, count=n),
            np.fromiter(map(_LENGTH, local), dtype=np.float64, count=n))


class AttentionWork:
    """The compute of a plan's core attention priced once by the cost model: every ring block and
    every local document, forward and backward; ``seconds`` gives a Compute's seconds per rank
    (its blocks' FLOPs, a fixed cost per sequence (query chunk) and one kernel call on every rank
    that has any: the engine packs them, runner.py; a local document is one sequence). With a shared
    CPU host (``cost.host``, spec/host.py; None on GPUs) a Compute also pays its split sequences'
    merge, and ``pack`` is the host CPU per rank with which each pass starts (``host.pack_s`` of its
    own ring rows; None without a host). Each block runs at its sequence's rate (``call_blocks_s``).
    With the Plan's ``schedule`` and a profile whose ``overlap_slowdown`` f is not 0, a Compute
    (the local documents included) runs at 1 - f of its speed while an exchange that its rank sends
    or receives is in flight (posted before it in the program, waited after it: NCCL's kernels take
    SMs): it pays f x min(its seconds, the seconds of those exchanges' ops on that rank, each
    stage's slowest op alone on its link, as if the exchange started with the kernel)."""

    def __init__(self, cost, docs: Sequence[DocPlan], rings: Sequence[Ring], world: int, local=None,
                 schedule: Optional[Sequence[CommOp]] = None):
        """``local``: ``local_arrays(docs)``, where the caller has it."""
        dmap = ring_documents(docs, rings)  # what ring_blocks and packing read
        b = ring_blocks(rings, dmap)
        ids = np.array([r.id for r in rings], dtype=np.int64)
        self.ring_id = ids[b.ring] if len(b.q) else b.ring
        self._top_id = int(ids.max(initial=-1)) + 1
        self.step, self.rank, self.seq, self.causal, self.q = b.step, b.rank, b.seq, b.causal, b.q
        self.cost, self.host = cost, cost.host
        self.kv, self.share = b.kv, b.share
        # per block, unless a call's sequences set the rate (then priced per Compute in seconds())
        self.sec = None if cost.profile.attn_by_sequence else \
            {bw: cost.block_flops_s(b.q, b.kv, b.causal, bw) * b.share for bw in (False, True)}
        self.call = {bw: cost.call_s(bw) for bw in (False, True)}  # one kernel call per rank per Compute
        self.per_seq = {bw: cost.seq_s(bw) for bw in (False, True)}  # per query chunk of a call
        self.members = {r.id: r.ranks for r in rings}
        own, L = local_arrays(docs) if local is None else local
        ranks = np.flatnonzero(np.bincount(own, minlength=world))  # np.unique(own), without its sort
        self.local = {}
        for bw in (False, True):  # bincount adds in document order, as np.add.at did
            t = np.bincount(own, cost.block_pass_s(L, L, True, bw), minlength=world) if len(own) else np.zeros(world)
            t[ranks] += self.call[bw]  # the local documents: one call
            self.local[bw] = t
        self.local_ranks = tuple(ranks.tolist())
        self.world = world
        self.pack = None if self.host is None else self._pack(cost, rings, dmap, world)
        self._seconds: Dict[Tuple[Compute, bool], np.ndarray] = {}
        self._by_step = None
        self._rings, self._schedule = rings, schedule
        self._slowed: Dict[bool, Dict[Compute, np.ndarray]] = {}
        # slowed()'s seconds per (queue, step, rings) posted: the backward posts the forward's K/V again
        self._post_s: Dict[Tuple, np.ndarray] = {}

    def seconds(self, c: Compute, backward: bool) -> np.ndarray:
        """Per rank seconds of ``c`` (one layer); a layer runs the same program every time, so
        each Compute is priced once (callers must not modify the array returned)."""
        key = (c, backward)
        out = self._seconds.get(key)
        if out is None:
            out = self.local[backward] if c.queue == DocClass.LOCAL else self._compute_s(c, backward)
            flying = self.slowed(backward).get(c)
            if flying is not None:
                out = out + self.cost.overlap_slowdown * np.minimum(out, flying)
            self._seconds[key] = out
        return out

    def slowed(self, backward: bool) -> Dict[Compute, np.ndarray]:
        """Per Compute of the pass's program with an exchange in flight, per rank the seconds of
        those exchanges' ops on it (a sender or receiver, relays included: per stage the slowest of
        its ops, latency + bytes / bandwidth, alone on the link); empty without a schedule or an
        overlap slowdown."""
        if backward not in self._slowed:
            out: Dict[Compute, np.ndarray] = {}
            if self._schedule is not None and self.cost.overlap_slowdown:
                cost = self.cost
                ops: Dict[Tuple[str, int, int], list] = {}
                flying: Dict[str, np.ndarray] = {}
                rate = {}  # per link class: (latency, bandwidth)
                for x in attention_program(self._rings, bool(self.local_ranks), backward):
                    if isinstance(x, Post) and (x.queue, x.step, x.rings) in self._post_s:
                        flying[x.name] = self._post_s[(x.queue, x.step, x.rings)]
                    elif isinstance(x, Post):
                        if not ops:
                            for o in self._schedule:
                                ops.setdefault((o.queue, o.step, o.ring), []).append(o)
                        slowest: Dict[Tuple[str, int], float] = {}
                        for r in x.rings:
                            for o in ops.get((x.queue, x.step, r), ()):
                                lat_bw = rate.get(o.link)
                                if lat_bw is None:
                                    lat_bw = rate[o.link] = (cost.latency(o.link), cost.bandwidth(o.link))
                                t = lat_bw[0] + o.nbytes / lat_bw[1]
                                for k in ((o.stage, o.src), (o.stage, o.dst)):  # max(held, t), as max() picks
                                    v = slowest.get(k, 0.0)
                                    slowest[k] = t if t > v else v
                        sec = np.zeros(self.world)
                        for (_, rank), t in slowest.items():
                            sec[rank] += t
                        flying[x.name] = self._post_s[(x.queue, x.step, x.rings)] = sec
                    elif isinstance(x, Wait):
                        flying.pop(x.name, None)
                    elif flying:
                        out[x] = sum(flying.values())
            self._slowed[backward] = out
        return self._slowed[backward]

    def _compute_s(self, c: Compute, backward: bool) -> np.ndarray:
        """Per rank seconds of the ring Compute ``c``, before any overlap slowdown."""
        out = np.zeros(self.world)
        # c's rings as a lookup over ring ids (np.isin costs more on a layer's small arrays)
        mine = np.zeros(self._top_id, dtype=bool)
        mine[[r for r in c.rings if r < self._top_id]] = True
        if len(c.steps) == 1:  # a zigzag step: only that step's blocks (kept in block order)
            idx = self._step_blocks(c.steps[0])
            m = idx[mine[self.ring_id[idx]]]
        else:
            m = mine[self.ring_id] & np.isin(self.step, c.steps)
        sec = self.sec[backward][m] if self.sec is not None else \
            call_blocks_s(self.cost, self.q[m], self.kv[m], self.causal[m], self.share[m], self.seq[m], backward)
        out += np.bincount(self.rank[m], sec, minlength=self.world)
        out[np.bincount(self.rank[m], minlength=self.world) > 0] += self.call[backward]  # one call per rank
        if self.per_seq[backward]:  # each query chunk's blocks of the call: one sequence
            out += self.per_seq[backward] * sequences_per(self.rank[m], self.seq[m], self.causal[m], self.world)
        if self.host is not None:  # those mixing full keys and a causal run: their merge (CPU kernel)
            out += self.host.split_s(*splits_per(self.rank[m], self.seq[m], self.causal[m], self.q[m], self.world),
                                     backward)
        return out

    @staticmethod
    def _pack(cost, rings: Sequence[Ring], dmap, world: int) -> np.ndarray:
        """Seconds per rank, each pass, with which every member packs its own rows of each ring (its
        chunks i and 2G-1-i of every document) into the K/V message it holds (runner.LayerRun), on
        a shared host's CPU."""
        own = np.zeros(world)
        for r in rings:
            if r.docs and r.size:
                chunks = np.diff(np.array([dmap[d].bounds for d in r.docs], dtype=np.float64), axis=1).sum(0)
                g = r.size
                np.add.at(own, list(r.ranks), chunks[:g] + chunks[g:][::-1])
        return cost.host.pack_s(own * cost.kv_bytes_per_token)

    def _step_blocks(self, step: int) -> np.ndarray:
        """Indices of the blocks of ring step ``step``, in block order."""
        if self._by_step is None:
            order = np.argsort(self.step, kind="stable")
            cuts = np.searchsorted(self.step[order], np.arange(int(self.step.max(initial=0)) + 2))
            self._by_step = (order, cuts)
        order, cuts = self._by_step
        if step + 1 >= len(cuts):
            return order[:0]
        return order[cuts[step]:cuts[step + 1]]

    def ranks(self, c: Compute) -> Tuple[int, ...]:
        """The ranks ``c`` runs kernels on (ring members, or owners of local documents)."""
        if c.queue == DocClass.LOCAL:
            return self.local_ranks
        return tuple(sorted({x for rid in c.rings for x in self.members[rid]}))
