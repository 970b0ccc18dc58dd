"""The planner's prediction of one iteration per rank, from the parts of a Plan.

One layer: QKV projection on the attention layout -> the core attention, the layer program of
program.py (queues inter, intra; the local documents inside the first exchange; the engine's
overlap points and pipelined dK/dV) -> output projection -> remap -> MLP on the linear layout ->
remap back; the backward mirrors it. Every cost comes from the cost model (cost_model.py).

Each rank has a clock (its compute stream). An exchange (a ring step's CommOps, a remap's moves) runs
stage by stage; an op starts when both its ends have posted it, so a rank waits for its ring
partners, the proxies of its routed messages and its remap partners: that waiting is charged as
exposed communication (or remap time), as the runtime pays it. Message time: latency + the busiest
link (NVLink port or NIC) of the op's stage / bandwidth, the links loaded also by the exchanges the
program says fly with it (a backward step's K/V with the previous step's dK/dV).
Every layer starts with all ranks together (the simulator's ``scale`` mode). The DP gradient
all-reduce is the Plan's own term (``Plan.allreduce_s``), not in the per-rank costs.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from typing import Dict, List, Sequence, Tuple

from ..topology import link_ports
from .cost_model import LINEAR_PASSES, CostModel
from .program import AttentionWork, Compute, Post, attention_program
from .types import MIRROR, STAGES, CommOp, DocPlan, Move, RankCost, Ring, Segment


def _link_keys(op: CommOp, cost: CostModel):
    return link_ports(op.link, op.src, op.dst, op.nic, cost.topology)


def step_message_times(ops: Sequence[CommOp], cost: CostModel, scale: float = 1.0) -> Dict[Tuple, float]:
    """Arrival time of every message of one step: {(ring, block, msg_src, msg_dst): seconds}."""
    load: Dict[Tuple, float] = defaultdict(float)
    for o in ops:
        for k in _link_keys(o, cost):
            load[(o.stage,) + k] += o.nbytes * scale
    per_msg_stage: Dict[Tuple, Dict[str, float]] = defaultdict(dict)
    for o in ops:
        busiest = max(load[(o.stage,) + k] for k in _link_keys(o, cost))
        t = cost.latency(o.link) + busiest / cost.bandwidth(o.link)
        key = (o.ring, o.block, o.msg_src, o.msg_dst)
        per_msg_stage[key][o.stage] = max(per_msg_stage[key].get(o.stage, 0.0), t)
    return {k: sum(v.get(s, 0.0) for s in STAGES) for k, v in per_msg_stage.items()}


def _hop(stage, src, dst, nbytes, link, nic, cost, own=(True, True), piece=None):
    """(stage, src, dst, bytes, (out-link key, in-link key), link, own, piece) as the simulator's
    LinkTable keys it; ``own``: (the sender originates the message, the receiver is its
    destination); ``piece``: (message key, start, stop), or None for a one-hop message."""
    return (stage, src, dst, nbytes, link_ports(link, src, dst, nic, cost.topology), link, own, piece)


def _op_hops(ops, cost, reverse=False):
    topo = cost.topology
    if not reverse:
        return [_hop(o.stage, o.src, o.dst, o.nbytes, o.link, o.nic, cost, (o.src == o.msg_src, o.dst == o.msg_dst),
                     ((o.ring, o.block, o.msg_src, o.msg_dst), o.start, o.stop)) for o in ops]
    return [_hop(MIRROR[o.stage], o.dst, o.src, o.nbytes, o.link, topo.nic_of(o.dst) if o.link != "nvlink" else -1, cost,
                 (o.dst == o.msg_dst, o.src == o.msg_src), ((o.ring, o.block, o.msg_dst, o.msg_src), o.start, o.stop))
            for o in ops]


def _exchange(hops, clock, cost, busy_until=None, relay_end=None, also=()) -> Dict[int, float]:
    """When each involved rank's wait() on one exchange returns, as distributed/executor.py runs it:
    every rank posts its receives and the sends of the messages it originates at its ``clock``; a
    proxy's relay forwards each piece as soon as it has arrived (in stage order, one after the
    other), independent of the proxy's compute. An op starts when its sender has the rows and its
    receiver has posted, and takes latency + the busiest link (NVLink port or NIC) of its stage /
    bandwidth. A rank's wait() returns when its own ops are done (sends of messages it originates,
    pieces of messages ending at it): a proxy does not wait for the pieces it relays (they end by
    ``relay_end``, per rank, updated in place when given).
    ``busy_until``: per rank, when an earlier exchange on the same links ends.
    ``also``: hops of another exchange in flight meanwhile: they load the links, are not timed.

    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> cost = toy_context(nodes=2, gpus=2, nics=2).cost
    >>> piece = ((0, 0, 0, 3), 0, 100)  # rows [0, 100) of the message 0 -> 3
    >>> hops = [_hop("dispatch", 0, 1, 10**6, "nvlink", -1, cost, (True, False), piece),  # 0 -> proxy 1
    ...         _hop("transfer", 1, 3, 10**6, "nic", 1, cost, (False, True), piece)]     # proxy 1 -> 3
    >>> done = _exchange(hops, np.array([0.0, 5.0, 0.0, 0.0]), cost)  # the proxy posts at t = 5 s
    >>> bool(done[1] == 5.0 and done[0] > 5.0 and done[3] > done[0])  # the proxy itself waits for nothing
    True
    """
    load: Dict[Tuple, float] = defaultdict(float)
    for h in list(hops) + list(also):
        for k in h[4]:  # its ports: two, or four above the NIC level (topology.link_ports)
            load[(h[0],) + k] += h[3]
    own: Dict[int, float] = {}
    for h in hops:
        own.setdefault(h[1], clock[h[1]])
        own.setdefault(h[2], clock[h[2]])
    arrived: Dict[Tuple, List[Tuple[int, int, float]]] = defaultdict(list)  # (message, rank) -> pieces
    relay_post: Dict[int, float] = {}  # per proxy: when its relay posted its last forward
    for stage in STAGES:
        for h in hops:
            if h[0] != stage:
                continue
            _, src, dst, _, keys, link, (src_own, dst_own), piece = h
            ready = clock[src]
            if not src_own:  # a relayed piece: when it arrived here, after the relay's previous forward
                key, a, b = piece
                ready = max([t for a0, b0, t in arrived[(key, src)] if a0 <= a and b <= b0] + [ready])
                ready = max(ready, relay_post.get(src, ready))
                relay_post[src] = ready
            t0 = max(ready, clock[dst])
            if busy_until is not None:
                t0 = max(t0, busy_until.get(src, 0.0), busy_until.get(dst, 0.0))
            t = t0 if src == dst else t0 + cost.latency(link) + max(
                [load[(stage,) + k] for k in keys]) / cost.bandwidth(link)
            if piece is not None:
                arrived[(piece[0], dst)].append((piece[1], piece[2], t))
            if src_own and t > own[src]:
                own[src] = t
            if dst_own and t > own[dst]:
                own[dst] = t
            if relay_end is not None:
                relay_end[src] = max(relay_end[src], t)
                relay_end[dst] = max(relay_end[dst], t)
    return own


class _Attention:
    """The core attention of one layer on every rank (forward or backward), advancing per-rank
    clocks: the layer program (program.py) priced by the cost model and ``_exchange``."""

    def __init__(self, docs, rings, schedule, cost: CostModel):
        self.cost, self.world = cost, cost.topology.world_size
        self.work = AttentionWork(cost, docs, rings, self.world)
        self.ops: Dict[Tuple[str, int], List[CommOp]] = defaultdict(list)
        for o in schedule:
            self.ops[(o.queue, o.step)].append(o)
        has_local = any(d.cls == "local" for d in docs)
        self.program = {bw: attention_program(rings, has_local, bw) for bw in (False, True)}
        self._hops: Dict[Tuple[bool, str], list] = {}
        self._posts = {bw: {x.name: x for x in prog if isinstance(x, Post)} for bw, prog in self.program.items()}

    def hops(self, backward: bool, name: str):
        """The hops of the exchange ``name`` (cached: a layer runs the same program every time)."""
        key = (backward, name)
        if key not in self._hops:
            x = self._posts[backward][name]
            rings = set(x.rings)
            self._hops[key] = _op_hops([o for o in self.ops[(x.queue, x.step)] if o.ring in rings], self.cost,
                                       reverse=x.reverse)
        return self._hops[key]

    def run(self, clock: np.ndarray, backward: bool, busy: np.ndarray) -> None:
        """Advance ``clock`` through the layer's attention program; add compute seconds to ``busy``.

        An exchange is timed when posted (``_exchange``), with the exchanges the program says it
        shares its links with loading them. Backward zigzag ring, compute-bound, per member:
        max(c_0, T) + sum_{s=1}^{G-2} max(c_s, 2T) + max(c_{G-1}, T), then step G-1's dK/dV (T),
        waited at the next queue's overlap point or at the end (tests/unit/test_predict_backward.py).
        """
        done: Dict[str, Dict[int, float]] = {}
        for x in self.program[backward]:
            if isinstance(x, Compute):
                t = self.work.seconds(x, backward)
                clock[:] += t
                busy[:] += t
            elif isinstance(x, Post):
                h = self.hops(backward, x.name)
                also = [o for n in x.shares for o in self.hops(backward, n)]
                done[x.name] = _exchange(h, clock, self.cost, also=also) if h else {}
            else:
                for r, t in done.pop(x.name).items():
                    if t > clock[r]:
                        clock[r] = t


class RingParts(tuple):
    """``ring_costs``'s (attention, exposed) lists, carrying the per-layer attention model for predict."""
    attention: "_Attention"


def ring_costs(docs: Sequence[DocPlan], rings: Sequence[Ring], schedule: Sequence[CommOp], cost: CostModel
               ) -> Tuple[List[float], List[float]]:
    """Per rank (attention seconds, exposed communication seconds) of one iteration of the core
    attention alone (every rank starting each layer's forward and backward together): what the
    attention layout and the routed schedule cost, before the linear modules and the remap."""
    att = _Attention(docs, rings, schedule, cost)
    L, world = cost.model.layers, cost.topology.world_size
    busy, total = np.zeros(world), np.zeros(world)
    for backward in (False, True):
        clock = np.zeros(world)
        att.run(clock, backward, busy)
        total += clock
    out = RingParts(((busy * L).tolist(), ((total - busy) * L).tolist()))
    out.attention = att
    return out


def _attention_tokens(docs: Sequence[DocPlan], rings: Sequence[Ring], world: int) -> np.ndarray:
    tok = np.zeros(world)
    dmap = {d.doc: d for d in docs}
    for d in docs:
        if d.cls == "local":
            tok[d.owner] += d.length
    for r in rings:
        g2 = 2 * r.size
        for d in r.docs:
            b = dmap[d].bounds
            for i, rank in enumerate(r.ranks):
                tok[rank] += b[i + 1] - b[i] + b[g2 - i] - b[g2 - 1 - i]
    return tok


def predict(docs: Sequence[DocPlan], rings: Sequence[Ring], linear_layout: Sequence[Sequence[Segment]],
            schedule: Sequence[CommOp], moves: Sequence[Move], cost: CostModel, parts=None
            ) -> Tuple[RankCost, ...]:
    """Per-rank predicted costs: RankCost(attention, linear (projections on the attention layout, MLP
    and vocab head on the linear layout), exposed ring communication and waiting for partners, remap
    (its transfers and the wait for its partners)); ``total_s`` is when the rank finishes.
    ``parts``: ``ring_costs``'s result when the caller already has it (its attention model is reused)."""
    world = cost.topology.world_size
    L = cost.model.layers
    att = parts.attention if isinstance(parts, RingParts) else _Attention(docs, rings, schedule, cost)
    t_att = _attention_tokens(docs, rings, world)
    t_lin = np.array([sum([x.stop - x.start for x in linear_layout[r]]) for r in range(world)], dtype=np.float64)
    qkv, out, mlp = cost.gemm_s(t_att, "qkv"), cost.gemm_s(t_att, "out"), cost.gemm_s(t_lin, "mlp")  # forward, one layer
    head = LINEAR_PASSES * cost.gemm_s(t_lin, "head")

    tp_ar = cost.tp_allreduce_s  # Megatron TP (no sequence parallelism): 2 all-reduces per layer and pass

    remap_f = [_hop("direct", mv.src, mv.dst, mv.tokens * cost.hidden_bytes_per_token,
                    cost.link_of(mv.src, mv.dst), cost.topology.nic_of(mv.src), cost) for mv in moves if mv.tokens]
    topo = cost.topology
    remap_b = [_hop("direct", x[2], x[1], x[3], x[5], topo.nic_of(x[2]) if x[5] != "nvlink" else -1, cost) for x in remap_f]
    attn_busy, lin_busy, remap_t = np.zeros(world), np.zeros(world), np.zeros(world)
    total = np.zeros(world)

    def lin(clock, t):
        clock += t
        lin_busy[:] += t

    def remap(clock, hops):
        if hops:
            before = clock.copy()
            for r, t in _exchange(hops, clock, cost).items():
                clock[r] = max(clock[r], t)
            remap_t[:] += clock - before

    c = np.zeros(world)  # forward of one layer
    lin(c, qkv)
    att.run(c, False, attn_busy)
    lin(c, out + tp_ar(t_att))
    remap(c, remap_f)
    lin(c, mlp + tp_ar(t_lin))
    remap(c, remap_b)
    total += c
    c = np.zeros(world)  # backward of one layer
    remap(c, remap_f)
    lin(c, 2 * mlp + tp_ar(t_lin))
    remap(c, remap_b)
    lin(c, 2 * out)
    att.run(c, True, attn_busy)
    lin(c, 2 * qkv + tp_ar(t_att))
    total += c
    total = total * L + head
    a, li, rm = attn_busy * L, lin_busy * L + head, remap_t * L
    exp = np.maximum(0.0, total - a - li - rm)
    return tuple(RankCost(float(a[r]), float(li[r]), float(exp[r]), float(rm[r])) for r in range(world))


def lower_bound(lengths: Sequence[int], cost: CostModel) -> float:
    """Perfect balance, every document at its own (most efficient) length, all communication hidden.

    Still a lower bound with the split linear work: a rank's iteration time is at least its busy
    time, so the slowest rank takes at least the mean busy time over the ranks. The total busy time
    is at least the sum of each document's attention run whole (splitting only makes blocks smaller
    and the profile's rate grows with length) plus the projections of every token (on the attention
    layout, wherever the token is) plus the MLP and head of every token (on the linear layout):
    proj_s(N) + mlp_s(N) = linear_s(N) whatever the layouts; waiting and exposed transfers only add.
    With TP, every token's activations also go through Megatron's 4 TP all-reduces per layer (2 per
    pass), which run on the critical path whatever the strategy: their bandwidth term is busy time
    too (``predict``'s ``tp_ar`` without its per-call latency)."""
    world = cost.topology.world_size
    n = sum(int(x) for x in lengths)
    att = float(cost.doc_attention_np(np.asarray(lengths, dtype=np.float64)).sum())
    tp_ar = 4 * cost.model.layers * float(cost.tp_allreduce_s(n, latency=False))
    return (att + cost.linear_s(n) + tp_ar) / world
