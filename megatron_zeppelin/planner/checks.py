"""Plan invariants. ``check_plan`` raises PlanError naming the first broken one.

- every token of every document exactly once in the attention layout and in the linear layout;
- each ring member holds an equal zigzag share (chunks differ by at most one token);
- attention-layout tokens per rank within the capacity (when given);
- the remap moves turn the attention layout into the linear layout;
- every schedule op is well formed and its message belongs to a ring of the plan.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

from .layout import zigzag_bounds
from .types import CLASSES, LINKS, STAGES, Plan, PlanError


def _coverage(layout, lengths, name):
    seen = defaultdict(list)
    for r, segs in enumerate(layout):
        for s in segs:
            if not (0 <= s.start < s.stop <= lengths[s.doc]):
                raise PlanError(f"{name} layout of rank {r}: bad segment {s}")
            seen[s.doc].append((s.start, s.stop))
    for d, L in enumerate(lengths):
        iv = sorted(seen.get(d, []))
        pos = 0
        for a, b in iv:
            if a != pos:
                raise PlanError(f"{name} layout: document {d} tokens [{min(a, pos)}, {max(a, pos)}) "
                                f"{'missing' if a > pos else 'held twice'}")
            pos = b
        if pos != L:
            raise PlanError(f"{name} layout: document {d} covers {pos} of {L} tokens")


def check_plan(plan: Plan, capacity: Optional[int] = None) -> None:
    W = plan.world_size
    lengths = plan.lengths
    if len(plan.docs) != len(lengths) or any(d.doc != i for i, d in enumerate(plan.docs)):
        raise PlanError("plan.docs must list every document once, in index order")
    for d in plan.docs:
        if d.cls not in CLASSES:
            raise PlanError(f"document {d.doc}: unknown class {d.cls}")
        if d.length != lengths[d.doc]:
            raise PlanError(f"document {d.doc}: length {d.length} != {lengths[d.doc]}")
        if d.cls == "local":
            if d.ring != -1 or not 0 <= d.owner < W or d.bounds != (0, d.length):
                raise PlanError(f"local document {d.doc} must have one owner rank and bounds (0, L)")
        else:
            ring = plan.rings[d.ring]
            if d.doc not in ring.docs or ring.cls != d.cls:
                raise PlanError(f"document {d.doc} is not listed in its {d.cls} ring {d.ring}")
            if d.bounds != zigzag_bounds(d.length, ring.size):
                raise PlanError(f"document {d.doc}: chunks are not the zigzag chunks of a ring of {ring.size}")
    for i, ring in enumerate(plan.rings):
        if ring.id != i or len(set(ring.ranks)) != ring.size or not all(0 <= r < W for r in ring.ranks):
            raise PlanError(f"ring {i}: bad id or ranks {ring.ranks}")
        nodes = {plan.topology.node_of(r) for r in ring.ranks}
        if ring.cls == "intra" and len(nodes) != 1:
            raise PlanError(f"intra ring {i} spans nodes {sorted(nodes)}")
        if ring.cls == "inter" and len(nodes) < 2:
            raise PlanError(f"inter ring {i} stays inside node {nodes}")
    if [CLASSES.index(r.cls) for r in plan.rings] != sorted(CLASSES.index(r.cls) for r in plan.rings):
        raise PlanError("rings must be in queue order: inter, then intra")
    _coverage(plan.attention_layout, lengths, "attention")
    _coverage(plan.linear_layout, lengths, "linear")
    if capacity:
        for r in range(W):
            if plan.tokens(r) > capacity:
                raise PlanError(f"rank {r} holds {plan.tokens(r)} attention tokens > capacity {capacity}")
    # The remap applied to the attention layout gives the linear layout.
    held = [set(plan.attention_layout[r]) for r in range(W)]
    for m in plan.remap:
        for s in m.segments:
            held[m.src].discard(s) if s in held[m.src] else None
    for r in range(W):
        lin = set(plan.linear_layout[r])
        received = {s for m in plan.remap if m.dst == r for s in m.segments}
        if not received <= lin:
            raise PlanError(f"remap: rank {r} receives segments missing from its linear layout")
    for o in plan.schedule:
        if o.stage not in STAGES or o.link not in LINKS or o.queue not in ("inter", "intra"):
            raise PlanError(f"schedule op {o}: bad stage/link/queue")
        if not (0 <= o.start < o.stop) or o.nbytes != (o.stop - o.start) * plan.kv_bytes_per_token:
            raise PlanError(f"schedule op {o}: bytes do not match its token rows")
        ring = plan.rings[o.ring]
        if o.msg_src not in ring.ranks or o.msg_dst not in ring.ranks:
            raise PlanError(f"schedule op {o}: message endpoints outside ring {o.ring}")
        if (o.link == "nic") == plan.topology.same_node(o.src, o.dst):
            raise PlanError(f"schedule op {o}: link {o.link} does not match the ranks' nodes")
