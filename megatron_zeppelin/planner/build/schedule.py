"""Ring schedule: the direct (unrouted) messages of every ring step, as CommOps.

Zigzag ring (``p2p``): at step s member i holds the K/V block of member (i - s) mod G and passes it
to member i + 1. Steps 0..G-2 run in the forward; step G-1 only in the backward (dK/dV come home).
All rings of one queue step together: global step s of the queue is step s of each of its rings.
All-gather ring (``allgather``): one step in which every member sends its block to every other.

Worked example: one intra ring of ranks (0, 1) holding a document of 6 tokens (member 0 holds 3
tokens, member 1 holds 3), 4 bytes of K/V per token:

>>> from megatron_zeppelin.spec.topology import Topology
>>> from megatron_zeppelin.planner.types import DocPlan, Ring
>>> ring = Ring(id=0, ranks=(0, 1), cls="intra", docs=(0,))
>>> doc = DocPlan(0, 6, "intra", 0, -1, (0, 1, 3, 4, 6))
>>> ops = ring_ops([ring], {0: doc}, Topology(1, 2), kv_bytes_per_token=4)
>>> [(o.step, o.src, o.dst, o.block, o.stop, o.nbytes, o.link) for o in ops]
[(0, 0, 1, 0, 3, 12, 'nvlink'), (0, 1, 0, 1, 3, 12, 'nvlink'), (1, 0, 1, 1, 3, 12, 'nvlink'), (1, 1, 0, 0, 3, 12, 'nvlink')]
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.planner.types import CommOp, DocPlan, Ring
from megatron_zeppelin.spec.words import RING_QUEUES, Comm, Link, Stage


def block_tokens(ring: Ring, docs: Dict[int, DocPlan]) -> List[int]:
    """Tokens each member of ``ring`` holds (its K/V block size): chunks i and 2G-1-i of each document."""
    g2 = 2 * ring.size
    bounds = [docs[d].bounds for d in ring.docs]
    return [sum([b[i + 1] - b[i] + b[g2 - i] - b[g2 - 1 - i] for b in bounds]) for i in range(ring.size)]


def _op(topo: Topology, ring: Ring, step: int, block: int, src: int, dst: int, tokens: int, kvb: int,
        link_of: Optional[Callable[[int, int], str]]) -> CommOp:
    """The direct CommOp of one ring message (one hop, the whole block)."""
    inter = not topo.same_node(src, dst)
    link = link_of(src, dst) if link_of is not None else Link.NIC if inter else Link.NVLINK
    return CommOp(queue=ring.cls, step=step, ring=ring.id, block=block, msg_src=src, msg_dst=dst, src=src, dst=dst,
                  start=0, stop=tokens, nbytes=tokens * kvb, link=link, nic=topo.nic_of(src) if inter else -1,
                  stage=Stage.DIRECT)


def ring_messages(rings: Sequence[Ring], docs: Dict[int, DocPlan]) -> List[Tuple]:
    """Every message the rings need, (queue, step, ring, block, msg_src, msg_dst, tokens), in ring,
    step, member order: the one statement of who sends which K/V block when (ring_ops turns them
    into direct CommOps; checks.py holds a schedule to them)."""
    out: List[Tuple] = []
    for ring in rings:
        g = ring.size
        if g < 2:
            continue
        sizes = block_tokens(ring, docs)
        if ring.comm == Comm.ALLGATHER:  # one step: every member's block to every other member
            sends = [(0, i, i, (i + k) % g) for i in range(g) for k in range(1, g)]
        else:  # zigzag: at step s member i passes block (i - s) mod G on to member i + 1
            sends = [(s, (i - s) % g, i, (i + 1) % g) for s in range(g) for i in range(g)]
        out += [(ring.cls, s, ring.id, b, ring.ranks[i], ring.ranks[j], sizes[b]) for s, b, i, j in sends if sizes[b]]
    return out


def ring_ops(rings: Sequence[Ring], docs: Dict[int, DocPlan], topo: Topology, kv_bytes_per_token: int,
             link_of: Optional[Callable[[int, int], str]] = None) -> List[CommOp]:
    """Direct CommOps of every ring message; ``link_of`` (CostModel.link_of) names each hop's link
    class (default: nvlink inside a node, nic across nodes)."""
    ring_of = {r.id: r for r in rings}
    ops = [_op(topo, ring_of[rid], s, b, src, dst, n, kv_bytes_per_token, link_of)
           for _, s, rid, b, src, dst, n in ring_messages(rings, docs)]
    ops.sort(key=lambda o: (RING_QUEUES.index(o.queue), o.step, o.ring, o.src))
    return ops
