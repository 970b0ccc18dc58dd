"""The planner's prediction of one iteration per rank, from the parts of a Plan.

Per queue and global ring step a rank computes its blocks while its messages move; what the compute
does not hide is exposed. Message time follows the schedule's ops: each stage of a step runs after
the previous one, and every op shares its link (a GPU's NVLink port, or a NIC) with the other ops of
the same stage on that link. Forward steps move K/V; backward steps move K/V and dK/dV (twice the
bytes) against 2.5x the compute. The simulator (sim/) refines this with an event model of the same ops.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Sequence, Tuple

from .cost_model import BWD_FLOPS, CostModel
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


def predict(docs: Sequence[DocPlan], rings: Sequence[Ring], linear_layout: Sequence[Sequence[Segment]],
            schedule: Sequence[CommOp], moves: Sequence[Move], cost: CostModel) -> Tuple[RankCost, ...]:
    world = cost.topology.world_size
    layers = cost.model.layers
    dmap = {d.doc: d for d in docs}
    attn = [0.0] * world
    exposed = [0.0] * world
    for d in docs:
        if d.cls == "local":
            attn[d.owner] += cost.block_s(d.length, d.length, True)
    by_step: Dict[Tuple[str, int], List[CommOp]] = defaultdict(list)
    for o in schedule:
        by_step[(o.queue, o.step)].append(o)
    for queue in ("inter", "intra"):
        qrings = [r for r in rings if r.cls == queue]
        steps = max((r.size for r in qrings), default=0)
        for s in range(steps):
            fwd_msgs = step_message_times(by_step.get((queue, s), ()), cost, 1.0)
            bwd_msgs = step_message_times(by_step.get((queue, s), ()), cost, 2.0)
            comp_f = defaultdict(float)
            comp_b = defaultdict(float)
            for r in qrings:
                if s >= r.size:
                    continue
                if r.comm == "allgather":
                    if s > 0:
                        continue
                    # Llama-3 CP: gather all K/V once, then every q chunk attends its whole prefix.
                    for i, rank in enumerate(r.ranks):
                        for d in r.docs:
                            for seg in dmap[d].member_segments(i):
                                f = cost.block_s(len(seg), seg.start, False, 1) + cost.block_s(len(seg), len(seg), True, 1)
                                attn[rank] += f * layers
                    continue
                for i, rank in enumerate(r.ranks):
                    for q, k, c in ring_step_blocks(r, dmap, i, s):
                        fwd = cost.block_fwd_s(q, k, c)
                        comp_f[rank] += fwd
                        comp_b[rank] += cost.block_s(q, k, c, 1) - fwd
            for rank in set(comp_f) | {o.msg_dst for o in by_step.get((queue, s), ())}:
                arrive_f = max((t for (rg, b, ms, md), t in fwd_msgs.items() if md == rank), default=0.0)
                arrive_b = max((t for (rg, b, ms, md), t in bwd_msgs.items() if md == rank), default=0.0)
                last_fwd_step = all(s >= r.size - 1 for r in qrings if rank in r.ranks and r.comm == "p2p")
                allg = any(r.comm == "allgather" and rank in r.ranks for r in qrings)
                cf, cb = comp_f.get(rank, 0.0), comp_b.get(rank, 0.0)
                if allg:  # not overlapped (TE/Megatron all-gather CP): fully exposed, fwd and bwd
                    exposed[rank] += layers * (arrive_f + arrive_b)
                    continue
                attn[rank] += layers * (cf + cb)
                if not last_fwd_step:
                    exposed[rank] += layers * max(0.0, arrive_f - cf)
                exposed[rank] += layers * max(0.0, arrive_b - cb)
    # Remap: attention->linear and back in the forward, mirrored in the backward: 4 exchanges a layer.
    remap = [0.0] * world
    if moves:
        out_b: Dict[int, Dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for m in moves:
            link = cost.link_of(m.src, m.dst)
            nb = m.tokens * cost.hidden_bytes_per_token
            out_b[m.src][link] += nb
            out_b[m.dst][link] += nb
        for r, per in out_b.items():
            t = max(cost.transfer_s(b, l) for l, b in per.items())
            remap[r] = 4 * layers * t
    lin = [cost.linear_s(sum(len(x) for x in linear_layout[r])) for r in range(world)]
    return tuple(RankCost(attn[r], lin[r], exposed[r], remap[r]) for r in range(world))


def lower_bound(lengths: Sequence[int], cost: CostModel) -> float:
    """Perfect balance, every document at its own (most efficient) length, all communication hidden."""
    world = cost.topology.world_size
    att = sum(cost.doc_attention_s(L) for L in lengths)
    return (att + cost.linear_s(sum(lengths))) / world
