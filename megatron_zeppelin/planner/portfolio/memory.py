"""Memory as a constraint with a price, for Zeppelin's pick (strategies.choose).

When the fastest plan's per-rank peak activation memory is over MEMORY_BALANCE x the mean
(assemble.py), the fastest plan within it is taken instead if it is at most MEMORY_SLACK slower
and no slower than any baseline shape assembled (candidates.py: Zeppelin still never predicts
slower than a baseline). Remap off moves nothing but leaves the attention layout's token imbalance
in memory; the time-balanced remap, capped by memory (assemble.memory_caps), evens it out inside
each node (not across nodes: a node running a long document's ring while the other nodes take the
short documents stays imbalanced).
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from megatron_zeppelin.planner.build.assemble import MEMORY_BALANCE, activation_weights
from megatron_zeppelin.planner.context import PlanContext
from megatron_zeppelin.planner.build.remap import linear_tokens
from megatron_zeppelin.planner.strategies import faster

MEMORY_SLACK = 0.03


class MemoryChoice:
    """The fastest plan offered, the fastest whose memory is balanced, and the fastest baseline
    shape: (seconds, plan, candidate) each, or None."""

    def __init__(self, ctx: PlanContext):
        self.best = self.fit = self.shape = None
        self.weights = activation_weights(ctx.cost)

    def offer(self, plan, candidate) -> None:
        t = plan.predicted_iteration_s
        if "shape" in candidate.placement.meta and (self.shape is None or faster(t, self.shape[0])):
            self.shape = (t, plan, candidate)  # a baseline's shape (candidates.py)
        if (self.best is not None and not faster(t, self.best[0]) and self.fit is not None
                and not faster(t, self.fit[0])):
            return
        mem = memory_imbalance(plan, candidate.prepared, self.weights)
        if self.best is None or faster(t, self.best[0]):
            self.best = (t, plan, candidate)
        if (self.fit is None or faster(t, self.fit[0])) and mem <= MEMORY_BALANCE:
            self.fit = (t, plan, candidate)

    def pick(self) -> Optional[Tuple[float, object, object]]:
        b, f = self.best, self.fit
        if b is None or f is None or f is b or f[0] > (1 + MEMORY_SLACK) * b[0]:
            return b
        if self.shape is not None and faster(self.shape[0], f[0]):
            return b
        return f


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
    >>> ctx, L = toy_context(nodes=1, gpus=4, capacity=8000), [4000, 1500, 1000, 900, 700, 500, 400, 300]
    >>> [pick("zeppelin", L, ctx)[0].tokens(r) for r in range(4)]  # the fastest: 2600 > 1.1 x 2325
    [2150, 2050, 2500, 2600]
    >>> plan = plan_memory_first(L, ctx)
    >>> plan.meta.token_cap, [plan.tokens(r) for r in range(4)], [plan.tokens(r, "linear") for r in range(4)]
    (2557, [2500, 2000, 2300, 2500], [2500, 2000, 2300, 2500])
    """
    from dataclasses import replace

    from megatron_zeppelin.planner.strategies import pick
    from megatron_zeppelin.planner.types import PlanError
    cap = memory_cap(lengths, ctx)
    if cap < ctx.capacity:
        try:
            plan = pick("zeppelin", lengths, replace(ctx, capacity=cap, memory_first=True))[0]
            return replace(plan, meta=replace(plan.meta, token_cap=cap))
        except PlanError:
            pass  # no placement holds the batch under the cap
    return pick("zeppelin", lengths, ctx)[0]


def memory_imbalance(plan, prepared, weights) -> float:
    """Per-rank peak activation memory, max / mean: attention tokens from the prepared placement
    (or the plan's layout), linear tokens after the remap's moves."""
    a, l = weights
    if prepared is not None and getattr(prepared, "att_tokens", ()):
        att = np.asarray(prepared.att_tokens, dtype=np.float64)
    else:
        att = np.array([sum([s.stop - s.start for s in r]) for r in plan.attention_layout], dtype=np.float64)
    mem = a * att + l * linear_tokens(att, plan.remap)
    mean = float(mem.mean())
    return float(mem.max()) / mean if mean > 0 else 1.0
