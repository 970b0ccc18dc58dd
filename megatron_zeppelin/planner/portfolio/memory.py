"""--zeppelin-balance-memory: Zeppelin planned under a memory cap (``plan_memory_first``).

The default pick weighs memory as a constraint with a price (choice.py, MemoryChoice); this entry
plans the same search with a tighter capacity instead, so every rank's both layouts stay within
MEMORY_BALANCE x the batch's mean tokens.
"""

from __future__ import annotations

from dataclasses import replace

from megatron_zeppelin.planner.build.assemble import MEMORY_BALANCE
from megatron_zeppelin.planner.context import PlanContext
from megatron_zeppelin.planner.strategies import pick
from megatron_zeppelin.planner.types import PlanError


def memory_cap(lengths, ctx: PlanContext) -> int:
    """The per-rank token cap of --zeppelin-balance-memory: MEMORY_BALANCE x the batch's mean tokens
    per rank, within memory's own capacity.

    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> memory_cap([4000, 3000, 1000], toy_context(nodes=1, gpus=4))   # 1.1 x 2000
    2200
    """
    return min(ctx.capacity, int(MEMORY_BALANCE * sum(lengths) / ctx.topology.world_size))


def plan_memory_first(lengths, ctx: PlanContext):
    """Zeppelin's Plan with --zeppelin-balance-memory: planned with both layouts of every rank within
    ``memory_cap`` tokens, the same search under a tighter capacity (the greedy then tops a long
    document's ring members up with short documents, or gives the document a wider ring). A rank's
    activation memory is a_bytes x its attention-layout tokens + l_bytes x its linear-layout tokens,
    and both layouts hold the batch's tokens, so the mean is (a + l) x the mean tokens and no rank
    is above MEMORY_BALANCE x it. Its price is predicted time (docs/partitioner.md) and planning
    time; where no plan fits under the cap (a batch of few long documents), the plan without it.
    The Plan's ``token_cap`` says which.

    >>> from megatron_zeppelin.planner.strategies import pick
    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> from megatron_zeppelin.spec.config import ZeppelinConfig   # p2p shapes only (a2a2 wins otherwise)
    >>> cfg = ZeppelinConfig(gpus_per_node=4, cp_comm="p2p")
    >>> ctx, L = toy_context(nodes=1, gpus=4, capacity=8000, config=cfg), [4000, 1400, 900, 900, 600, 300]
    >>> [pick("zeppelin", L, ctx)[0].tokens(r) for r in range(4)]  # the fastest: 2400 > 1.1 x 2025
    [2400, 1900, 1900, 1900]
    >>> plan = plan_memory_first(L, ctx)
    >>> plan.meta.token_cap, [plan.tokens(r) for r in range(4)], [plan.tokens(r, "linear") for r in range(4)]
    (2227, [2000, 1700, 2200, 2200], [2000, 1700, 2200, 2200])
    """
    cap = memory_cap(lengths, ctx)
    if cap < ctx.capacity:
        try:
            plan = pick("zeppelin", lengths, replace(ctx, capacity=cap, memory_first=True))[0]
            return replace(plan, meta=replace(plan.meta, token_cap=cap))
        except PlanError:
            pass  # no placement holds the batch under the cap
    return pick("zeppelin", lengths, ctx)[0]
