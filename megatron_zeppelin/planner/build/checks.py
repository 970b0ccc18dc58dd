"""Plan invariants. ``check_plan`` raises PlanError naming the first broken one; each check is exact.

- documents: listed once in index order, lengths as planned, a known class; local ones have one
  owner and bounds (0, L); ring ones are listed by their ring, with its class, and carry the zigzag
  bounds of its size (2G chunks differing by at most one token: equal zigzag shares);
- rings: ids in order, distinct in-range ranks, intra inside one node, inter across nodes, queue
  order (inter rings before intra rings), every listed document on that ring;
- attention layout: exactly the layout derived from docs and rings (layout.attention_layout) and
  every token of every document exactly once; per-rank tokens within the capacity (when given);
- linear layout: every token exactly once; the remap moves applied to the attention layout give it
  exactly (a sender keeps its other tokens in order, a receiver appends what it gets in source-rank
  order); with no moves the two layouts are equal;
- schedule: exactly the messages the rings need (p2p: at step s member i passes member (i-s) mod G's
  block to member i+1; allgather: one step, every block to every other member), each message's
  rows [0, block tokens) carried from msg_src to msg_dst exactly once through well-formed stages
  (a hop only forwards rows its source already holds), bytes = rows x K/V bytes per token, the link
  matching the ranks' nodes and a NIC hop leaving on the NIC wired to its source;
- prediction: one finite, non-negative cost per rank.

Worked example: a hand-made plan breaks the zigzag invariant.

>>> from dataclasses import replace
>>> from megatron_zeppelin.planner.baselines.packed_dp import plan_packed_dp
>>> from megatron_zeppelin.planner.build.assemble import assemble
>>> from megatron_zeppelin.planner.testing import toy_context
>>> ctx = toy_context(nodes=1, gpus=2)
>>> plan = assemble("packed_dp", [5, 3], ctx, plan_packed_dp([5, 3], ctx))
>>> check_plan(plan, capacity=8)
>>> check_plan(plan, capacity=4)
Traceback (most recent call last):
...
megatron_zeppelin.planner.errors.PlanError: capacity: rank 0 holds 5 attention tokens > 4
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

from megatron_zeppelin.planner.build.layout import attention_layout, zigzag_bounds
from megatron_zeppelin.planner.build.schedule import ring_messages, row_bytes
from megatron_zeppelin.planner.types import Plan, PlanError, Segment
from megatron_zeppelin.spec.words import CLASSES, COMMS, LINKS, RING_QUEUES, STAGES, DocClass, Layout, Link, Stage


def check_plan(plan: Plan, capacity: Optional[int] = None) -> None:
    check_docs_and_rings(plan)
    check_layouts(plan, capacity)
    check_remap(plan)
    check_schedule(plan)
    check_prediction(plan)


# --- documents and rings ---------------------------------------------------------------------
def check_docs_and_rings(plan: Plan) -> None:
    W, lengths, topo = plan.world_size, plan.lengths, plan.topology
    if len(plan.docs) != len(lengths) or any(d.doc != i for i, d in enumerate(plan.docs)):
        raise PlanError("docs: plan.docs must list every document once, in index order")
    for i, ring in enumerate(plan.rings):
        if ring.id != i or ring.size < 1 or len(set(ring.ranks)) != ring.size \
                or not all(0 <= r < W for r in ring.ranks):
            raise PlanError(f"rings: ring {i} has a bad id {ring.id} or ranks {ring.ranks}")
        if ring.cls not in RING_QUEUES or ring.comm not in COMMS:
            raise PlanError(f"rings: ring {i} has class {ring.cls!r} / comm {ring.comm!r}")
        nodes = {topo.node_of(r) for r in ring.ranks}
        if ring.cls == DocClass.INTRA and len(nodes) != 1:
            raise PlanError(f"rings: intra ring {i} spans nodes {sorted(nodes)}")
        if ring.cls == DocClass.INTER and len(nodes) < 2:
            raise PlanError(f"rings: inter ring {i} stays inside node {sorted(nodes)}")
        if len(set(ring.docs)) != len(ring.docs):
            raise PlanError(f"rings: ring {i} lists a document twice")
        for d in ring.docs:
            if not (0 <= d < len(lengths)) or plan.docs[d].ring != i:
                raise PlanError(f"rings: ring {i} lists document {d}, which is not on it")
    order = [CLASSES.index(r.cls) for r in plan.rings]
    if order != sorted(order):
        raise PlanError("rings: not in queue order (inter rings, then intra rings)")
    for d in plan.docs:
        if d.cls not in CLASSES:
            raise PlanError(f"docs: document {d.doc} has unknown class {d.cls!r}")
        if d.length != lengths[d.doc]:
            raise PlanError(f"docs: document {d.doc} has length {d.length} != {lengths[d.doc]}")
        if d.cls == DocClass.LOCAL:
            if d.ring != -1 or not 0 <= d.owner < W or tuple(d.bounds) != (0, d.length):
                raise PlanError(f"docs: local document {d.doc} must have one owner rank and bounds (0, L)")
            continue
        if not 0 <= d.ring < len(plan.rings) or d.owner != -1:
            raise PlanError(f"docs: {d.cls} document {d.doc} has ring {d.ring} and owner {d.owner}")
        ring = plan.rings[d.ring]
        if d.doc not in ring.docs or ring.cls != d.cls:
            raise PlanError(f"docs: document {d.doc} is not listed in its {d.cls} ring {d.ring}")
        if tuple(d.bounds) != zigzag_bounds(d.length, ring.size):
            raise PlanError(f"zigzag: document {d.doc} does not have the zigzag chunks of a ring of {ring.size}")
        sizes = [b - a for a, b in zip(d.bounds, d.bounds[1:])]
        if max(sizes) - min(sizes) > 1:  # implied by zigzag_bounds; stated for the reader
            raise PlanError(f"zigzag: document {d.doc} has unequal chunks {sizes}")


# --- layouts ---------------------------------------------------------------------------------
def _coverage(layout: Sequence[Sequence[Segment]], lengths: Sequence[int], name: Layout) -> None:
    seen = defaultdict(list)
    for r, segs in enumerate(layout):
        for s in segs:
            if not (0 <= s.doc < len(lengths)) or not (0 <= s.start < s.stop <= lengths[s.doc]):
                raise PlanError(f"{name} layout of rank {r}: bad segment {s}")
            seen[s.doc].append((s.start, s.stop))
    for d, L in enumerate(lengths):
        pos = 0
        for a, b in sorted(seen.get(d, [])):
            if a != pos:
                raise PlanError(f"{name} layout: document {d} tokens [{min(a, pos)}, {max(a, pos)}) "
                                f"{'missing' if a > pos else 'held twice'}")
            pos = b
        if pos != L:
            raise PlanError(f"{name} layout: document {d} covers {pos} of {L} tokens")


def check_layouts(plan: Plan, capacity: Optional[int] = None) -> None:
    W = plan.world_size
    if len(plan.attention_layout) != W or len(plan.linear_layout) != W:
        raise PlanError("layouts: one attention and one linear layout per rank are required")
    _coverage(plan.attention_layout, plan.lengths, Layout.ATTENTION)
    _coverage(plan.linear_layout, plan.lengths, Layout.LINEAR)
    derived = attention_layout(plan.docs, plan.rings, W)
    for r in range(W):
        if tuple(plan.attention_layout[r]) != derived[r]:
            raise PlanError(f"attention layout of rank {r} is not the one its rings and local documents give")
    if capacity:
        for r in range(W):
            if plan.tokens(r) > capacity:
                raise PlanError(f"capacity: rank {r} holds {plan.tokens(r)} attention tokens > {capacity}")


# --- remap -----------------------------------------------------------------------------------
def _remove(segs: List[Segment], cut: Segment) -> List[Segment]:
    """``segs`` without the tokens of ``cut``, which must lie inside one of them."""
    for k, s in enumerate(segs):
        if s.doc == cut.doc and s.start <= cut.start and cut.stop <= s.stop:
            parts = [Segment(s.doc, s.start, cut.start), Segment(s.doc, cut.stop, s.stop)]
            return segs[:k] + [p for p in parts if len(p)] + segs[k + 1:]
    raise KeyError(cut)


def _merged(segs: Sequence[Segment]) -> List[Segment]:
    """Adjacent segments of one document joined (so equal token sequences compare equal)."""
    out: List[Segment] = []
    for s in segs:
        if out and out[-1].doc == s.doc and out[-1].stop == s.start:
            out[-1] = Segment(s.doc, out[-1].start, s.stop)
        else:
            out.append(s)
    return out


def check_remap(plan: Plan) -> None:
    W = plan.world_size
    if not plan.remap:
        for r in range(W):
            if _merged(plan.attention_layout[r]) != _merged(plan.linear_layout[r]):
                raise PlanError(f"remap: no moves, but rank {r}'s linear layout differs from its attention layout")
        return
    kept = [list(r) for r in plan.attention_layout]
    pairs = set()
    for m in plan.remap:
        if not (0 <= m.src < W and 0 <= m.dst < W) or m.src == m.dst or not m.segments:
            raise PlanError(f"remap: bad move {m.src} -> {m.dst}")
        if (m.src, m.dst) in pairs:
            raise PlanError(f"remap: two moves {m.src} -> {m.dst}")
        pairs.add((m.src, m.dst))
        for s in m.segments:
            try:
                kept[m.src] = _remove(kept[m.src], s)
            except KeyError:
                raise PlanError(f"remap: rank {m.src} sends {s}, which it does not hold") from None
    got = [list(k) for k in kept]
    for m in sorted(plan.remap, key=lambda m: (m.dst, m.src)):
        got[m.dst].extend(m.segments)
    for r in range(W):
        if _merged(got[r]) != _merged(plan.linear_layout[r]):
            raise PlanError(f"remap: the moves applied to rank {r}'s attention layout do not give its linear layout")


# --- schedule --------------------------------------------------------------------------------
def expected_messages(plan: Plan) -> Dict[Tuple, int]:
    """{(queue, step, ring, block, msg_src, msg_dst): rows} of every message the rings need."""
    return {m[:6]: m[6] for m in ring_messages(plan.rings, {d.doc: d for d in plan.docs})}


def _contained(held: List[Tuple[int, int]], a: int, b: int) -> bool:
    return any(x <= a and b <= y for x, y in held)


def check_schedule(plan: Plan) -> None:
    topo, W, kvb = plan.topology, plan.world_size, plan.kv_bytes_per_token
    want = expected_messages(plan)
    by_msg: Dict[Tuple, list] = defaultdict(list)
    ring_of = {r.id: r for r in plan.rings}
    qb = plan.meta.q_bytes_per_token or 0
    for o in plan.schedule:
        # link classes beyond nvlink and nic come from the profile (its levels): any identifier
        if o.stage not in STAGES or not (o.link in LINKS or str(o.link).isidentifier()) or o.queue not in RING_QUEUES:
            raise PlanError(f"schedule: op {o} has a bad stage, link or queue")
        if not (0 <= o.src < W and 0 <= o.dst < W) or o.src == o.dst:
            raise PlanError(f"schedule: op {o} has bad ranks")
        ring = ring_of.get(o.ring)
        try:
            per_row = kvb if ring is None else row_bytes(ring, o.step, kvb, qb)
        except ValueError as e:
            raise PlanError(f"schedule: op {o}: {e}") from None
        if not (0 <= o.start < o.stop) or o.nbytes != (o.stop - o.start) * per_row:
            raise PlanError(f"schedule: op {o} bytes do not match its token rows")
        if (o.link != Link.NVLINK) == topo.same_node(o.src, o.dst):
            raise PlanError(f"schedule: op {o} link {o.link} does not match the ranks' nodes")
        if o.link != Link.NVLINK and o.nic != topo.nic_of(o.src):
            raise PlanError(f"schedule: op {o} leaves on NIC {o.nic}, not on the NIC of rank {o.src}")
        if o.link == Link.NVLINK and o.nic != -1:
            raise PlanError(f"schedule: NVLink op {o} names NIC {o.nic}")
        by_msg[(o.queue, o.step, o.ring, o.block, o.msg_src, o.msg_dst)].append(o)
    for key in by_msg:
        if key not in want:
            raise PlanError(f"schedule: message {key} is not one the rings need")
    for key, rows in want.items():
        ops = by_msg.get(key)
        if not ops:
            raise PlanError(f"schedule: message {key} ({rows} rows) is missing")
        _check_message(key, rows, ops)


def _check_message(key, rows: int, ops) -> None:
    msg_src, msg_dst = key[4], key[5]
    held: Dict[int, List[Tuple[int, int]]] = defaultdict(list)
    held[msg_src].append((0, rows))
    direct = [o for o in ops if o.stage == Stage.DIRECT]
    if direct and len(direct) != len(ops):
        raise PlanError(f"schedule: message {key} mixes direct and routed stages")
    for stage in STAGES:
        for o in (o for o in ops if o.stage == stage):
            if o.stop > rows or not _contained(held[o.src], o.start, o.stop):
                raise PlanError(f"schedule: message {key}: {stage} op {o.src}->{o.dst} rows "
                                f"[{o.start}, {o.stop}) are not held by rank {o.src} at that stage")
            if stage == Stage.DISPATCH and o.src != msg_src or stage == Stage.COMBINE and o.dst != msg_dst:
                raise PlanError(f"schedule: message {key}: {stage} op {o.src}->{o.dst} has the wrong end")
            held[o.dst].append((o.start, o.stop))
    got = sorted(held[msg_dst])
    pos = 0
    for a, b in got:
        if a != pos:
            raise PlanError(f"schedule: message {key}: rows [{min(a, pos)}, {max(a, pos)}) "
                            f"{'never arrive' if a > pos else 'arrive twice'} at rank {msg_dst}")
        pos = b
    if pos != rows:
        raise PlanError(f"schedule: message {key}: {pos} of {rows} rows arrive at rank {msg_dst}")


# --- prediction ------------------------------------------------------------------------------
def check_prediction(plan: Plan) -> None:
    if len(plan.cost) != plan.world_size:
        raise PlanError(f"prediction: {len(plan.cost)} rank costs for {plan.world_size} ranks")
    for r, c in enumerate(plan.cost):
        for name in ("attention_s", "linear_s", "comm_exposed_s", "remap_s"):
            v = getattr(c, name)
            if not (isinstance(v, float) and math.isfinite(v) and v >= 0):
                raise PlanError(f"prediction: rank {r} {name} = {v!r}")
    if not (math.isfinite(plan.lower_bound_s) and plan.lower_bound_s >= 0):
        raise PlanError(f"prediction: lower bound {plan.lower_bound_s!r}")
    if plan.thresholds.local_max > plan.thresholds.intra_max:
        raise PlanError("thresholds: local_max > intra_max")
