"""The layer program: what one attention layer computes and exchanges, derived from a Plan once.

The engine, the prediction and the simulator read the ring work from here instead of each
enumerating it: ``ring_blocks`` lists every (query chunk, key/value chunk) block each ring member
computes at each ring step (zigzag: member i at step s attends its chunks i and 2G-1-i to those of
member (i - s) mod G, causal: a kv chunk after the q chunk is skipped; all-gather rings use the
same blocks, step s = the block of member (i - s) mod G).

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
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .types import RING_QUEUES, STAGES, CommOp, DocPlan, Ring, Stage


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


def ring_blocks(rings: Sequence[Ring], docs: Dict[int, DocPlan]) -> RingBlocks:
    cols: Tuple[list, ...] = ([], [], [], [], [], [], [])
    for ri, r in enumerate(rings):
        for s in range(r.size):
            for i, rank in enumerate(r.ranks):
                for q, k, c in ring_step_blocks(r, docs, i, s):
                    for col, v in zip(cols, (q, k, c, ri, i, s, rank)):
                        col.append(v)
    q, kv, c, ri, i, s, rank = cols
    f, n, b = np.float64, np.int64, bool
    return RingBlocks(np.array(q, dtype=f), np.array(kv, dtype=f), np.array(c, dtype=b), np.array(ri, dtype=n),
                      np.array(i, dtype=n), np.array(s, dtype=n), np.array(rank, dtype=n))


def ring_step_costs(cost, rings: Sequence[Ring], docs: Dict[int, DocPlan], steps: int, world: int):
    """Per ring step and rank, (forward, backward) compute seconds of one layer of ``rings``, as
    [steps, world] arrays, priced by the cost model's one block function."""
    b = ring_blocks(rings, docs)
    fwd, bwd = np.zeros((steps, world)), np.zeros((steps, world))
    if len(b.q):
        np.add.at(fwd, (b.step, b.rank), cost.block_pass_s(b.q, b.kv, b.causal))
        np.add.at(bwd, (b.step, b.rank), cost.block_pass_s(b.q, b.kv, b.causal, True))
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
        routed = [p for p in self.phases if p != "direct"]
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

    Queues inter, then intra; in a queue the all-gather rings, then the zigzag (p2p) rings, all
    rings of a queue stepping together. The *overlap point* is right after the first compute of
    each queue (ring kind): the first runs the local documents (inside the layer's first
    exchange); in the backward later ones wait for the previous queue's last dK/dV exchange.
    - zigzag forward: step s posts its K/V exchange (rings with s < G-1), computes, waits.
    - zigzag backward (ring-flash-attention): step s posts its K/V exchange, computes (step s-1's
      dK/dV in flight), waits for that dK/dV, posts step s's dK/dV (rings with s < G), waits for
      the K/V; step G-1's dK/dV is waited at the next overlap point (or at the end).
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
            prog.append(Compute("local"))
        pending[0] = None

    for queue in RING_QUEUES:
        qr = [r for r in rings if r.cls == queue]
        ag = tuple(r.id for r in qr if r.comm == "allgather")
        if ag:
            size = max(r.size for r in qr if r.comm == "allgather")
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
        p2p = [r for r in qr if r.comm == "p2p"]
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


class AttentionWork:
    """The compute of a plan's core attention priced once by the cost model: every ring block and
    every local document, forward and backward; ``seconds`` gives a Compute's seconds per rank."""

    def __init__(self, cost, docs: Sequence[DocPlan], rings: Sequence[Ring], world: int):
        dmap = {d.doc: d for d in docs}
        b = ring_blocks(rings, dmap)
        ids = np.array([r.id for r in rings], dtype=np.int64)
        self.ring_id = ids[b.ring] if len(b.q) else b.ring
        self.step, self.rank = b.step, b.rank
        self.sec = {bw: cost.block_pass_s(b.q, b.kv, b.causal, bw) for bw in (False, True)}
        self.members = {r.id: r.ranks for r in rings}
        loc = [d for d in docs if d.cls == "local"]
        L = np.array([d.length for d in loc], dtype=np.float64)
        own = np.array([d.owner for d in loc], dtype=np.int64)
        self.local = {}
        for bw in (False, True):
            t = np.zeros(world)
            np.add.at(t, own, cost.block_pass_s(L, L, True, bw))
            self.local[bw] = t
        self.local_ranks = tuple(sorted(set(own.tolist())))
        self.world = world

    def seconds(self, c: Compute, backward: bool) -> np.ndarray:
        """Per rank seconds of ``c`` (one layer)."""
        if c.queue == "local":
            return self.local[backward]
        out = np.zeros(self.world)
        m = np.isin(self.ring_id, c.rings) & np.isin(self.step, c.steps)
        np.add.at(out, self.rank[m], self.sec[backward][m])
        return out

    def ranks(self, c: Compute) -> Tuple[int, ...]:
        """The ranks ``c`` runs kernels on (ring members, or owners of local documents)."""
        if c.queue == "local":
            return self.local_ranks
        return tuple(sorted({x for rid in c.rings for x in self.members[rid]}))
