"""Ring schedule: the direct (unrouted) messages of every ring step, as CommOps.

Zigzag ring (``p2p``): at step s member i holds the K/V block of member (i - s) mod G and passes it
to member i + 1. Steps 0..G-2 run in the forward; step G-1 only in the backward (dK/dV come home).
All rings of one queue step together: global step s of the queue is step s of each of its rings.
All-gather ring (``allgather``): one step in which every member sends its block to every other.
All-to-all ring (``a2a``, DeepSpeed-Ulysses as Transformer Engine runs it:
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py,
AttnFuncWithCPAndQKVOA2A and flash_attn_a2a_communicate): step 0 moves Q/K/V, each member sending
member j the heads of group j of its own block (sequence-sharded -> head-sharded); step 1 moves the
output back, member j sending each member i the output rows of i's block for j's heads. Message
rows are tokens of the block; a row carries 1/G of the heads (``a2a_row_bytes``). The backward
mirrors both: dO as step 1 reversed, dQ/dK/dV as step 0 reversed.
Hierarchical ring (``a2a+p2p``, TE's AttnFuncWithCPAndKVP2P with cp_group = [a2a group, p2p
group], Megatron's ``--hierarchical-context-parallel-sizes a p``): members m = P*a + j (``a =
Ring.a2a`` consecutive members per all-to-all group P, j the head group). Step p (= size / a)
moves Q/K/V inside each group as an a2a ring of ``a`` members does; member (P, j) then holds, for
head group j, the *super block* P: chunks [P*a, (P+1)*a) and their mirrors, i.e. the zigzag
block P of a ring of p over the document cut at every a-th bound (``super_bounds``). Steps
0..p-1 are that zigzag ring of the p groups, one per head group j (member (P, j) passes super
block (P - s) mod p, message block ((P - s) mod p)*a + j, to member (P + 1, j)); step p + 1
brings the output home inside each group. The backward mirrors the a2a steps and runs the ring's
dK/dV steps as a zigzag ring does.

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
from megatron_zeppelin.planner.program import hier_p2p_size
from megatron_zeppelin.planner.types import CommOp, DocPlan, Ring
from megatron_zeppelin.spec.words import RING_QUEUES, Comm, Link, Stage


def block_tokens(ring: Ring, docs: Dict[int, DocPlan]) -> List[int]:
    """Tokens each member of ``ring`` holds (its K/V block size): chunks i and 2G-1-i of each document."""
    g2 = 2 * ring.size
    bounds = [docs[d].bounds for d in ring.docs]
    return [sum([b[i + 1] - b[i] + b[g2 - i] - b[g2 - 1 - i] for b in bounds]) for i in range(ring.size)]


def a2a_row_bytes(g: int, step: int, kv_bytes_per_token: int, q_bytes_per_token: int) -> int:
    """Bytes of one token row of an all-to-all message of a ring of ``g`` members: step 0 carries
    Q, K and V of one head group (1/g of the heads), step 1 the output of one head group. Needs
    g | the Q and the K/V heads (per TP rank), as TE asserts; the planner refuses other sizes.

    >>> a2a_row_bytes(2, 0, kv_bytes_per_token=16, q_bytes_per_token=32), a2a_row_bytes(2, 1, 16, 32)
    (24, 16)
    """
    per = q_bytes_per_token + (kv_bytes_per_token if step == 0 else 0)
    if not q_bytes_per_token or per % g:
        raise ValueError(f"an a2a ring of {g} members needs Q bytes per token divisible by it, got {q_bytes_per_token}")
    return per // g


def row_bytes(ring: Ring, step: int, kv_bytes_per_token: int, q_bytes_per_token: int = 0) -> int:
    """Bytes of one token row of ``ring``'s messages at ``step``: K/V of every head for p2p and
    all-gather rings; a head group's share of Q/K/V or of the output for a2a rings; for a2a+p2p
    rings the a2a steps' rows (steps p, p + 1) and the ring steps' K/V of one head group.

    >>> r = Ring(0, tuple(range(4)), "inter", (0,), Comm.A2A_P2P, a2a=2)   # p = 2
    >>> [row_bytes(r, s, kv_bytes_per_token=16, q_bytes_per_token=32) for s in (0, 1, 2, 3)]
    [8, 8, 24, 16]
    """
    if ring.comm == Comm.A2A:
        return a2a_row_bytes(ring.size, step, kv_bytes_per_token, q_bytes_per_token)
    if ring.comm == Comm.A2A_P2P:
        p = hier_p2p_size(ring)
        if step >= p:
            return a2a_row_bytes(ring.a2a, step - p, kv_bytes_per_token, q_bytes_per_token)
        if kv_bytes_per_token % ring.a2a:
            raise ValueError(f"an a2a+p2p ring's groups of {ring.a2a} cannot split {kv_bytes_per_token} K/V bytes")
        return kv_bytes_per_token // ring.a2a
    return kv_bytes_per_token


def _op(topo: Topology, ring: Ring, step: int, block: int, src: int, dst: int, tokens: int, kvb: int,
        link_of: Optional[Callable[[int, int], str]]) -> CommOp:
    """The direct CommOp of one ring message (one hop, the whole block); ``kvb``: bytes per row."""
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
        elif ring.comm == Comm.A2A:  # Q/K/V of block i to every head group j, then j's output of block i home
            sends = ([(0, i, i, (i + k) % g) for i in range(g) for k in range(1, g)]
                     + [(1, i, (i + k) % g, i) for i in range(g) for k in range(1, g)])
        elif ring.comm == Comm.A2A_P2P:  # a2a inside groups of a (steps p, p+1), a zigzag ring of groups
            a, p = ring.a2a, hier_p2p_size(ring)
            inside = [(P * a + j, P * a + (j + k) % a) for P in range(p) for j in range(a) for k in range(1, a)]
            sends = ([(p, i, i, j) for i, j in inside] + [(p + 1, i, j, i) for i, j in inside]
                     + [(s, ((P - s) % p) * a + j, P * a + j, ((P + 1) % p) * a + j)
                        for s in range(p) for P in range(p) for j in range(a)])
            sup = [sum(sizes[B * a:(B + 1) * a]) for B in range(p)]
            out += [(ring.cls, s, ring.id, b, ring.ranks[i], ring.ranks[j], sizes[b] if s >= p else sup[b // a])
                    for s, b, i, j in sends if (sizes[b] if s >= p else sup[b // a])]
            continue
        else:  # zigzag: at step s member i passes block (i - s) mod G on to member i + 1
            sends = [(s, (i - s) % g, i, (i + 1) % g) for s in range(g) for i in range(g)]
        out += [(ring.cls, s, ring.id, b, ring.ranks[i], ring.ranks[j], sizes[b]) for s, b, i, j in sends if sizes[b]]
    return out


def ring_ops(rings: Sequence[Ring], docs: Dict[int, DocPlan], topo: Topology, kv_bytes_per_token: int,
             link_of: Optional[Callable[[int, int], str]] = None, q_bytes_per_token: int = 0) -> List[CommOp]:
    """Direct CommOps of every ring message; ``link_of`` (CostModel.link_of) names each hop's link
    class (default: nvlink inside a node, nic across nodes); ``q_bytes_per_token`` sizes a2a
    rings' messages (row_bytes)."""
    ring_of = {r.id: r for r in rings}
    ops = [_op(topo, ring_of[rid], s, b, src, dst, n,
               row_bytes(ring_of[rid], s, kv_bytes_per_token, q_bytes_per_token), link_of)
           for _, s, rid, b, src, dst, n in ring_messages(rings, docs)]
    ops.sort(key=lambda o: (RING_QUEUES.index(o.queue), o.step, o.ring, o.src))
    return ops
