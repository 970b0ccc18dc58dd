"""Assembly: a strategy's Placement -> the full Plan (layouts, remap, routed schedule, prediction).

Every strategy goes through here, so every Plan is built the same way and the runtime and the
simulator see the same kind of data whichever strategy made it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from .context import Placement, PlanContext
from .layout import attention_layout
from .predict import lower_bound, predict
from .remap import plan_remap
from .schedule import ring_ops
from .types import CLASSES, Plan


def assemble(strategy: str, lengths: Sequence[int], ctx: PlanContext, placement: Placement) -> Plan:
    topo, cost = ctx.topology, ctx.cost
    # Queue order: inter rings first, then intra; stable within a class; ids renumbered.
    order = sorted(range(len(placement.rings)),
                   key=lambda i: (CLASSES.index(placement.rings[i].cls), i))
    new_id = {placement.rings[i].id: k for k, i in enumerate(order)}
    rings = tuple(replace(placement.rings[i], id=new_id[placement.rings[i].id]) for i in order)
    docs = tuple(sorted((replace(d, ring=new_id[d.ring]) if d.ring >= 0 else d for d in placement.docs),
                        key=lambda d: d.doc))
    att = attention_layout(docs, rings, topo.world_size)
    if placement.remap:
        lin, moves = plan_remap(att, topo, cost=cost)
    else:
        lin, moves = att, ()
    dmap = {d.doc: d for d in docs}
    ops = ring_ops(rings, dmap, topo, cost.kv_bytes_per_token)
    if placement.routing:
        from .routing import route_schedule
        ops = route_schedule(ops, topo, cost, ctx.config)
    rank_cost = predict(docs, rings, lin, ops, moves, cost)
    return Plan(strategy=strategy, topology=topo, lengths=tuple(int(x) for x in lengths), docs=docs,
                rings=rings, attention_layout=att, linear_layout=lin, remap=tuple(moves),
                schedule=tuple(ops), cost=rank_cost, lower_bound_s=lower_bound(lengths, cost),
                thresholds=placement.thresholds, kv_bytes_per_token=cost.kv_bytes_per_token,
                meta=tuple(sorted((str(k), str(v)) for k, v in placement.meta.items())))
