"""The planner's prediction of one iteration per rank, from the parts of a Plan.

Per queue and global ring step a rank computes its blocks while its messages move; what the compute
does not hide is exposed. Message time follows the schedule's ops: each stage of a step runs after
the previous one, and every op shares its link (a GPU's NVLink port, or a NIC) with the other ops of
the same stage on that link. Forward steps move K/V; backward steps move K/V and dK/dV (twice the
bytes) against 2.5x the compute. The simulator (sim/) refines this with an event model of the same ops.
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


def _ring_compute(qrings, dmap, cost: CostModel, steps: int, world: int, attn: List[float]):
    """Per-step, per-rank forward and backward compute seconds (one layer) of the p2p rings of one
    queue, as [steps, world] arrays; all-gather rings' attention is added to ``attn`` directly."""
    layers = cost.model.layers
    qs, ks, cs, at = [], [], [], []
    for r in qrings:
        if r.comm == "allgather":
            # Llama-3 CP: gather all K/V once, then every q chunk attends its whole prefix.
            for i, rank in enumerate(r.ranks):
                for d in r.docs:
                    for seg in dmap[d].member_segments(i):
                        f = cost.block_s(len(seg), seg.start, False, 1) + cost.block_s(len(seg), len(seg), True, 1)
                        attn[rank] += f * layers
            continue
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
        fwd = flops / (cost.attn_tflops_np(q) * 1e12)
        bwd = BWD_FLOPS * flops / (cost.attn_tflops_np(q, True) * 1e12)
        idx = np.array(at, dtype=np.int64)
        np.add.at(comp_f, idx, fwd)
        np.add.at(comp_b, idx, bwd)
    return comp_f.reshape(steps, world), comp_b.reshape(steps, world)


def ring_costs(docs: Sequence[DocPlan], rings: Sequence[Ring], schedule: Sequence[CommOp], cost: CostModel
               ) -> Tuple[List[float], List[float]]:
    """Per rank (attention seconds, exposed communication seconds) of one iteration: what the
    attention layout and the routed schedule cost, before the linear modules and the remap."""
    world = cost.topology.world_size
    layers = cost.model.layers
    dmap = {d.doc: d for d in docs}
    attn = [0.0] * world
    exposed = [0.0] * world
    # Local documents: one vectorised cost call (same numbers as block_s per document).
    loc = [d for d in docs if d.cls == "local"]
    if loc:
        t_loc = cost.block_s_np([d.length for d in loc], [d.length for d in loc], True)
        for d, t in zip(loc, t_loc.tolist()):
            attn[d.owner] += t
    by_step: Dict[Tuple[str, int], List[CommOp]] = defaultdict(list)
    for o in schedule:
        by_step[(o.queue, o.step)].append(o)
    for queue in ("inter", "intra"):
        qrings = [r for r in rings if r.cls == queue]
        steps = max((r.size for r in qrings), default=0)
        if not steps:
            continue
        # Per rank: the largest p2p ring it is in (its last forward step) and all-gather membership.
        p2p_size: Dict[int, int] = defaultdict(int)
        allg = set()
        for r in qrings:
            for rank in r.ranks:
                if r.comm == "allgather":
                    allg.add(rank)
                else:
                    p2p_size[rank] = max(p2p_size[rank], r.size)
        comp_f, comp_b = _ring_compute(qrings, dmap, cost, steps, world, attn)
        for s in range(steps):
            step_ops = by_step.get((queue, s), ())
            arrive_f = _arrivals(step_message_times(step_ops, cost, 1.0))
            arrive_b = _arrivals(step_message_times(step_ops, cost, 2.0))
            ranks = set(np.nonzero(comp_f[s])[0].tolist()) | set(arrive_f)
            for rank in ranks:
                af, ab = arrive_f.get(rank, 0.0), arrive_b.get(rank, 0.0)
                if rank in allg:  # not overlapped (TE/Megatron all-gather CP): fully exposed, fwd and bwd
                    exposed[rank] += layers * (af + ab)
                    continue
                cf, cb = float(comp_f[s, rank]), float(comp_b[s, rank])
                attn[rank] += layers * (cf + cb)
                if s < p2p_size[rank] - 1:  # the last forward step moves nothing
                    exposed[rank] += layers * max(0.0, af - cf)
                exposed[rank] += layers * max(0.0, ab - cb)
    return attn, exposed


def predict(docs: Sequence[DocPlan], rings: Sequence[Ring], linear_layout: Sequence[Sequence[Segment]],
            schedule: Sequence[CommOp], moves: Sequence[Move], cost: CostModel, parts=None
            ) -> Tuple[RankCost, ...]:
    """Per-rank predicted costs. ``parts``: ``ring_costs``'s result when the caller already has it."""
    world = cost.topology.world_size
    layers = cost.model.layers
    attn, exposed = parts if parts is not None else ring_costs(docs, rings, schedule, cost)
    # Remap: to linear and back per layer in the forward (none back after the last layer), mirrored
    # in the backward; one exchange is paced by each rank's busiest NVLink port or NIC (planner/remap.py).
    remap = [0.0] * world
    if moves:
        n_ex = remap_exchanges(layers)
        remap = [n_ex * t for t in remap_exchange_s(moves, cost)]
    lin = [cost.linear_s(sum([x.stop - x.start for x in linear_layout[r]])) for r in range(world)]
    return tuple(RankCost(attn[r], lin[r], exposed[r], remap[r]) for r in range(world))


def lower_bound(lengths: Sequence[int], cost: CostModel) -> float:
    """Perfect balance, every document at its own (most efficient) length, all communication hidden."""
    world = cost.topology.world_size
    att = float(cost.doc_attention_np(np.asarray(lengths, dtype=np.float64)).sum())
    return (att + cost.linear_s(sum(int(x) for x in lengths))) / world
