"""Test helpers for the engine: hand-built plans, a toy routed schedule, and one checked engine run.

``hand_plan`` builds a Plan through planner.assemble from a hand-made Placement: each document is
given an owner rank (local) or a ring of ranks (intra if inside one node, else inter).

>>> from megatron_zeppelin.spec.topology import Topology
>>> p = hand_plan([7, 3, 5], Topology(1, 2), [(0, 1), 1, 0])
>>> [(d.cls, d.ring, d.owner) for d in p.docs], [r.ranks for r in p.rings]
([('intra', 0, -1), ('local', -1, 1), ('local', -1, 0)], [(0, 1)])
>>> [len(s) for s in p.attention_layout[0]], [len(s) for s in p.attention_layout[1]]
([1, 2, 5], [2, 2, 3])
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence, Union

import torch

from megatron_zeppelin.planner.build.assemble import assemble
from megatron_zeppelin.planner.context import Placement
from megatron_zeppelin.planner.build.layout import zigzag_bounds
from megatron_zeppelin.planner.testing import toy_context
from megatron_zeppelin.planner.types import DocPlan, Plan, Ring, Thresholds
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.spec.words import Comm, DocClass, Link, Stage


def hand_plan(lengths: Sequence[int], topo: Topology, where: Sequence[Union[int, tuple]],
              comm: str = Comm.P2P, routing: bool = False, strategy: str = "packed_dp", a2a: int = 1) -> Plan:
    rings, docs, ring_of = [], [], {}
    for i, (L, w) in enumerate(zip(lengths, where)):
        if isinstance(w, int):
            docs.append(DocPlan(i, int(L), DocClass.LOCAL, -1, w, (0, int(L))))
            continue
        w = tuple(w)
        if w not in ring_of:
            cls = DocClass.INTRA if len({topo.node_of(r) for r in w}) == 1 else DocClass.INTER
            ring_of[w] = len(rings)
            rings.append(Ring(len(rings), w, cls, (), comm, a2a if comm == Comm.A2A_P2P else 1))
        rid = ring_of[w]
        rings[rid] = replace(rings[rid], docs=rings[rid].docs + (i,))
        docs.append(DocPlan(i, int(L), rings[rid].cls, rid, -1, zigzag_bounds(int(L), len(w))))
    ctx = toy_context(topo.nodes, topo.gpus_per_node, topo.nics_per_node)
    pl = Placement(docs=docs, rings=rings, thresholds=Thresholds(0, 0, "hand-built"), routing=routing)
    return assemble(strategy, list(lengths), ctx, pl)


def toy_route(plan: Plan) -> Plan:
    """Replace each inter-node op by dispatch -> transfer -> combine through proxies: the first
    half of its rows goes via the next local rank of each node, the rest direct. Exercises the
    executor's stages without depending on the routing pass."""
    topo, ops = plan.topology, []
    for o in plan.schedule:
        n = o.stop - o.start
        if o.link != Link.NIC or n < 2 or topo.gpus_per_node < 2:
            ops.append(o)
            continue
        mid = o.start + n // 2
        g = topo.gpus_per_node
        ps = topo.node_of(o.src) * g + (topo.local_of(o.src) + 1) % g
        pd = topo.node_of(o.dst) * g + (topo.local_of(o.dst) + 1) % g
        per = o.nbytes // max(1, n)
        ops.append(replace(o, src=o.src, dst=ps, stop=mid, nbytes=per * (mid - o.start), link=Link.NVLINK, nic=-1,
                           stage=Stage.DISPATCH))
        ops.append(replace(o, src=ps, dst=pd, stop=mid, nbytes=per * (mid - o.start), nic=topo.nic_of(ps),
                           stage=Stage.TRANSFER))
        ops.append(replace(o, src=pd, dst=o.dst, stop=mid, nbytes=per * (mid - o.start), link=Link.NVLINK, nic=-1,
                           stage=Stage.COMBINE))
        ops.append(replace(o, start=mid, nbytes=per * (o.stop - mid), stage=Stage.TRANSFER))
    return replace(plan, schedule=tuple(ops))


def rank_inputs(plan: Plan, rank: int, heads: int, kv_heads: int, d: int, dtype, seed: int = 0):
    """Global q/k/v/dout for the whole batch (same on every rank, from ``seed``) and this rank's rows."""
    gen = torch.Generator().manual_seed(seed)
    T = sum(plan.lengths)
    mk = lambda h: torch.randn(T, h, d, generator=gen, dtype=torch.float64)  # noqa: E731
    full = [mk(heads), mk(kv_heads), mk(kv_heads), mk(heads)]
    starts = [0]
    for L in plan.lengths:
        starts.append(starts[-1] + L)
    idx = [starts[s.doc] + p for s in plan.attention_layout[rank] for p in range(s.start, s.stop)]
    idx = torch.tensor(idx, dtype=torch.long)
    return [x.to(dtype) for x in full], idx


def check_engine(plan: Plan, rank: int, group, heads: int = 4, kv_heads: int = 2, d: int = 8,
                 dtype=torch.float64, seed: int = 0, backend: str = "auto", counters=None,
                 nan: bool = False) -> dict:
    """Run the engine on this rank's rows and compare out/dq/dk/dv with the reference on the whole
    batch. Returns max relative errors and the counters."""
    from megatron_zeppelin.attention.engine import AttentionEngine
    from megatron_zeppelin.attention.reference import reference_attention
    from megatron_zeppelin.distributed.counters import CommCounters
    (q, k, v, dout), idx = rank_inputs(plan, rank, heads, kv_heads, d, dtype, seed)
    if nan and len(idx):
        q = q.clone()
        q[idx[0], 0, 0] = float("nan")
    counters = counters if counters is not None else CommCounters()
    eng = AttentionEngine(plan, rank, group, counters=counters, backend=backend)
    lq, lk, lv = (x[idx].clone().requires_grad_(True) for x in (q, k, v))
    out = eng(lq, lk, lv)
    out.backward(dout[idx])
    rq, rk, rv = (x.to(torch.float64).clone().requires_grad_(True) for x in (q, k, v))
    ref = reference_attention(rq, rk, rv, plan.lengths)
    ref.backward(dout.to(torch.float64))
    res = {"counters": counters, "tokens": len(idx)}
    for name, a, whole in (("out", out, ref), ("dq", lq.grad, rq.grad), ("dk", lk.grad, rk.grad),
                           ("dv", lv.grad, rv.grad)):
        b = whole[idx]
        if nan:
            res[name] = bool(torch.isnan(a).any()) if len(idx) else None
            continue
        # relative to the whole batch's scale, not this rank's rows: a rank may hold only rows whose
        # reference is 0 up to rounding (dq of a document's first token is exactly 0 in exact arithmetic).
        # Where the whole reference is 0 (a batch of one 1-token document: dq and dk), relative to what
        # it is computed from (the values for out, the incoming gradient for dq/dk/dv): its rounding
        # there (1e-16, CPU-dependent) is no error.
        floor = (v if name == "out" else dout).abs().max().item()
        den = max(whole.abs().max().item(), floor, 1e-300) if b.numel() else 1.0
        res[name] = (a.to(torch.float64) - b).abs().max().item() / den if b.numel() else 0.0
        res[name + "_shape_ok"] = tuple(a.shape) == tuple(b.shape)
    return res


def expected_step_bytes(plan: Plan, rank: int, row_bytes: int, phase: str) -> dict:
    """Bytes this rank must send per (phase, queue, step) by the Plan's ops (p2p rings: K/V in the
    forward steps < G-1; K/V + dK/dV in the backward; dK/dV alone at step G-1; all-gather rings:
    K/V once forward, K/V plus the mirrored dK/dV backward)."""
    size = {r.id: r.size for r in plan.rings}
    comm = {r.id: r.comm for r in plan.rings}
    out: dict = {}
    for o in plan.schedule:
        rows = o.stop - o.start
        key = (phase, o.queue, o.step)
        if comm[o.ring] == Comm.ALLGATHER:
            n = rows * row_bytes * ((o.src == rank) + (phase == "bwd" and o.dst == rank))
        elif phase == "fwd":
            n = rows * row_bytes if (o.src == rank and o.step < size[o.ring] - 1) else 0
        else:
            n = rows * row_bytes * ((o.step < size[o.ring] - 1) + 1) if o.src == rank else 0
        if n:
            out[key] = out.get(key, 0) + n
    return out
