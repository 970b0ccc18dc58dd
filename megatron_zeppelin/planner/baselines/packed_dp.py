"""packed_dp: stock data parallelism with token-balanced packing; every document local.

Longest-processing-time packing by tokens: documents in decreasing length (ties by index) go to the
rank holding the fewest tokens so far (ties by rank). Equal tokens, not equal attention: that is the
imbalance Zeppelin removes.

>>> from megatron_zeppelin.planner.testing import toy_context
>>> p = plan_packed_dp([5, 1, 4, 2], toy_context(nodes=1, gpus=2))
>>> [(d.doc, d.owner) for d in p.docs]
[(0, 0), (1, 0), (2, 1), (3, 1)]
"""

from __future__ import annotations

import heapq
from typing import Sequence

from megatron_zeppelin.planner.context import Placement, PlanContext
from megatron_zeppelin.planner.strategies import strategy
from megatron_zeppelin.planner.types import DocPlan, Thresholds
from megatron_zeppelin.spec.words import DocClass, StrategyName


@strategy(StrategyName.PACKED_DP, order=1)
def plan_packed_dp(lengths: Sequence[int], ctx: PlanContext) -> Placement:
    world = ctx.topology.world_size
    heap = [(0, r) for r in range(world)]
    owner = {}
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        tok, r = heapq.heappop(heap)
        owner[i] = r
        heapq.heappush(heap, (tok + lengths[i], r))
    local = DocClass.LOCAL
    docs = [DocPlan(i, int(L), local, -1, owner[i], (0, int(L))) for i, L in enumerate(lengths)]
    big = max(lengths)
    return Placement(docs=docs, rings=[], thresholds=Thresholds(big, big, "packed_dp keeps every document local"))
