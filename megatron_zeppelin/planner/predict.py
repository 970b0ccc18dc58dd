"""The planner's prediction of one iteration per rank, from the parts of a Plan.

It follows one layer as the runtime runs it (design.md "Where Zeppelin sits"; the engine's
attention/ring.py and allgather.py; sim/layer.py times the same structure with an event model):
QKV projection on the attention layout -> queues inter, intra (all-gather rings, then zigzag rings,
every ring of a queue stepping together) with the local documents inside the first exchange ->
output projection -> remap -> MLP on the linear layout -> remap back; the backward mirrors it.

Each rank has a clock (its compute stream). An exchange (a ring step's CommOps, a remap's moves) runs
stage by stage; an op starts when both its ends have posted it, so a rank waits for its ring
partners, the proxies of its routed messages and its remap partners: that waiting is charged as
exposed communication (or remap time), as the runtime pays it. Message time: latency + the busiest
link (NVLink port or NIC) of the op's stage / bandwidth. Zigzag forward: step s's K/V exchange is
posted before the compute of step s (overlapped). Zigzag backward (ring-flash-attention order,
as the engine runs it): step s's K/V and step s-1's dK/dV fly together (sharing the links) during
step s's compute; the last dK/dV goes home during the next queue's first compute (or is exposed).
All-gather: gather, compute the own block meanwhile (forward), the rest after; backward: gather,
compute the other blocks, reduce-scatter their dK/dV during the own block and the next queue's
first compute.
Every layer starts with all ranks together (the simulator's ``scale`` mode).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from typing import Dict, List, Sequence, Tuple

from .cost_model import BWD_FLOPS, CostModel
from .remap import remap_exchange_s, remap_exchanges
from .types import STAGES, CommOp, DocPlan, Move, RankCost, Ring, Segment


def ring_step_blocks(ring: Ring, docs: Dict[int, DocPlan], member: int, step: int):
    """(q_len, kv_len, causal) blocks member computes at ``step`` (zigzag: kv of member (i - s) mod G)."""
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


def _link_keys(op: CommOp, cost: CostModel):
    if op.link == "nic":  # leaves on NIC op.nic, arrives on the NIC wired to the destination GPU
        return (("nic_out", op.nic), ("nic_in", cost.topology.nic_of(op.dst)))
    return (("nv_out", op.src), ("nv_in", op.dst))


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


def _arrivals(msgs: Dict[Tuple, float]) -> Dict[int, float]:
    """Latest message arrival per destination rank."""
    out: Dict[int, float] = {}
    for (_, _, _, md), t in msgs.items():
        if t > out.get(md, -1.0):
            out[md] = t
    return out



_MIRROR = {"direct": "direct", "dispatch": "combine", "transfer": "transfer", "combine": "dispatch"}


def _hop(stage, src, dst, nbytes, link, nic, cost, own=(True, True), piece=None):
    """(stage, src, dst, bytes, (out-link key, in-link key), link, own, piece) as the simulator's
    LinkTable keys it; ``own``: (the sender originates the message, the receiver is its
    destination); ``piece``: (message key, start, stop), or None for a one-hop message."""
    topo = cost.topology
    if link == "nic":
        keys = (("nic_out", nic if nic >= 0 else topo.nic_of(src)), ("nic_in", topo.nic_of(dst)))
    else:
        keys = (("nv_out", src), ("nv_in", dst))
    return (stage, src, dst, nbytes, keys, link, own, piece)


def _op_hops(ops, cost, reverse=False):
    topo = cost.topology
    if not reverse:
        return [_hop(o.stage, o.src, o.dst, o.nbytes, o.link, o.nic, cost, (o.src == o.msg_src, o.dst == o.msg_dst),
                     ((o.ring, o.block, o.msg_src, o.msg_dst), o.start, o.stop)) for o in ops]
    return [_hop(_MIRROR[o.stage], o.dst, o.src, o.nbytes, o.link, topo.nic_of(o.dst) if o.link == "nic" else -1, cost,
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
        load[(h[0],) + h[4][0]] += h[3]
        load[(h[0],) + h[4][1]] += h[3]
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
                load[(stage,) + keys[0]], load[(stage,) + keys[1]]) / cost.bandwidth(link)
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


def _ring_compute(qrings, dmap, cost: CostModel, steps: int, world: int):
    """Per global step and rank, forward and backward compute seconds (one layer) of ``qrings``, as
    [steps, world] arrays: member i at step s attends its chunks to those of member (i - s) mod G."""
    qs, ks, cs, at = [], [], [], []
    for r in qrings:
        for s in range(r.size):
            for i, rank in enumerate(r.ranks):
                for q, k, c in ring_step_blocks(r, dmap, i, s):
                    qs.append(q)
                    ks.append(k)
                    cs.append(c)
                    at.append(s * world + rank)
    comp_f = np.zeros(steps * world)
    comp_b = np.zeros(steps * world)
    if qs:
        q, k, c = np.array(qs, dtype=np.float64), np.array(ks, dtype=np.float64), np.array(cs, dtype=bool)
        hd = max(1, cost.model.heads // cost.tp) * cost.model.head_dim
        flops = np.where(c, 2.0 * q * (q + 1) * hd, 4.0 * q * k * hd)
        p = cost.profile
        fwd = flops / (cost.attn_tflops_np(q) * 1e12) + p.attn_call_fwd_us * 1e-6  # one kernel call per block
        bwd = BWD_FLOPS * flops / (cost.attn_tflops_np(q, True) * 1e12) + p.attn_call_bwd_us * 1e-6
        idx = np.array(at, dtype=np.int64)
        np.add.at(comp_f, idx, fwd)
        np.add.at(comp_b, idx, bwd)
    return comp_f.reshape(steps, world), comp_b.reshape(steps, world)


class _Attention:
    """The core attention of one layer on every rank (forward or backward), advancing per-rank clocks."""

    def __init__(self, docs, rings, schedule, cost: CostModel):
        self.cost, self.world = cost, cost.topology.world_size
        dmap = {d.doc: d for d in docs}
        ring_of = {r.id: r for r in rings}
        by_step: Dict[Tuple[str, int, str], List[CommOp]] = defaultdict(list)
        for o in schedule:
            by_step[(o.queue, o.step, ring_of[o.ring].comm)].append(o)
        self.queues = []  # (comm, steps, ring sizes, comp_f, comp_b, ops per step)
        for queue in ("inter", "intra"):
            for comm in ("allgather", "p2p"):
                qr = [r for r in rings if r.cls == queue and r.comm == comm]
                if not qr:
                    continue
                steps = max(r.size for r in qr)
                cf, cb = _ring_compute(qr, dmap, cost, steps, self.world)
                size = {r.id: r.size for r in qr}
                ops = [by_step.get((queue, s, comm), []) for s in range(steps)]
                self.queues.append((comm, steps, size, cf, cb, ops))
        p = cost.profile
        self.local_f, self.local_b = np.zeros(self.world), np.zeros(self.world)
        loc = [d for d in docs if d.cls == "local"]
        if loc:
            L = np.array([d.length for d in loc], dtype=np.float64)
            tot = cost.block_s_np(L, L, True) / cost.model.layers
            hd = max(1, cost.model.heads // cost.tp) * cost.model.head_dim
            f = 2.0 * L * (L + 1) * hd / (cost.attn_tflops_np(L) * 1e12)
            own = np.array([d.owner for d in loc], dtype=np.int64)
            np.add.at(self.local_f, own, f + p.attn_call_fwd_us * 1e-6)
            np.add.at(self.local_b, own, tot - f + p.attn_call_bwd_us * 1e-6)

    def run(self, clock: np.ndarray, backward: bool, busy: np.ndarray) -> None:
        """Advance ``clock`` through the layer's attention; add compute seconds to ``busy``.

        Backward zigzag ring (the engine's ring-flash-attention order): step s's K/V is posted
        before step s's compute and loads the links with step s-1's dK/dV, still in flight; after
        the compute the rank waits for that dK/dV and sends step s's on (it loads the links with
        step s+1's K/V). Compute-bound, per member: max(c_0, T) + sum_{s=1}^{G-2} max(c_s, 2T) +
        max(c_{G-1}, T), then step G-1's dK/dV (T), waited at the next queue's overlap point (after
        its first compute) or at the end (tests/unit/test_predict_backward.py checks this rule).
        """
        cost = self.cost
        local = self.local_b if backward else self.local_f
        pending = [True]  # True: the local documents; {rank: end}: the previous queue's last dK/dV

        def compute(t):
            clock[:] += t
            busy[:] += t

        def exchange(hops, also=()):
            return _exchange(hops, clock, cost, also=also) if hops else {}

        def wait(done):
            for r, t in done.items():
                if t > clock[r]:
                    clock[r] = t

        def overlap_point():  # the engine's: right after the first compute of each queue
            p = pending[0]
            if isinstance(p, dict):
                wait(p)
            elif p:
                compute(local)
            pending[0] = None

        for comm, steps, size, cf, cb, ops in self.queues:
            comp = cb if backward else cf
            if comm == "allgather":
                ex = exchange(_op_hops(ops[0], cost))  # gather K/V (again in the backward)
                if not backward:
                    compute(comp[0])  # own block while the gather flies
                overlap_point()
                wait(ex)
                compute(comp[1:].sum(axis=0))  # the other members' blocks
                if backward:  # their partial dK/dV home while the own block computes; waited later
                    pending[0] = exchange(_op_hops(ops[0], cost, reverse=True))
                    compute(comp[0])
                continue
            kv = [_op_hops([o for o in ops[s] if s < size[o.ring] - 1], cost) for s in range(steps)] + [[]]
            dkv = [_op_hops(o, cost) for o in ops] if backward else []
            ex_d = {}  # backward: the dK/dV exchange of the previous step, in flight
            for s in range(steps):
                # step s's K/V, posted before the compute (overlapped), shares the links with ex_d
                ex = exchange(kv[s], also=dkv[s - 1] if backward and s else ())
                compute(comp[s])
                overlap_point()
                if backward:  # add to the dK/dV received, send it on (flies with step s+1's K/V)
                    wait(ex_d)
                    ex_d = exchange(dkv[s], also=kv[s + 1])
                wait(ex)
            if backward:
                pending[0] = ex_d  # the last dK/dV comes home, waited at the next overlap point
        overlap_point()


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
    m, L, tp = cost.model, cost.model.layers, cost.tp
    att = parts.attention if isinstance(parts, RingParts) else _Attention(docs, rings, schedule, cost)
    t_att = _attention_tokens(docs, rings, world)
    t_lin = np.array([sum([x.stop - x.start for x in linear_layout[r]]) for r in range(world)], dtype=np.float64)
    rate = cost.profile.gemm_tflops * 1e12
    h, d = m.hidden, m.head_dim
    qkv = t_att * 2.0 * (h * m.heads * d + 2 * h * m.kv_heads * d) / tp / rate  # forward, one layer
    out = t_att * 2.0 * m.heads * d * h / tp / rate
    mlp = t_lin * 2.0 * 3 * h * m.ffn / tp / rate
    head = 3.0 * t_lin * m.head_flops_per_token(tp) / rate

    tp_ar = cost.tp_allreduce_s  # Megatron TP (no sequence parallelism): 2 all-reduces per layer and pass

    remap_f = [_hop("direct", mv.src, mv.dst, mv.tokens * cost.hidden_bytes_per_token,
                    cost.link_of(mv.src, mv.dst), cost.topology.nic_of(mv.src), cost) for mv in moves if mv.tokens]
    topo = cost.topology
    remap_b = [_hop("direct", x[2], x[1], x[3], x[5], topo.nic_of(x[2]) if x[5] == "nic" else -1, cost) for x in remap_f]
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
