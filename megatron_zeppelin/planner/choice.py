"""How the pick (strategies.choose) compares plans: ties, and memory as a constraint with a price.

``faster`` is the one comparison of predictions: beyond rounding, so the pick does not depend on
the order of the batch's documents.

When the fastest plan's per-rank peak activation memory is over MEMORY_BALANCE x the mean
(assemble.py), the fastest plan within it is taken instead if it is at most MEMORY_SLACK slower
and no slower than any baseline shape assembled (portfolio/shapes.py: Zeppelin still never
predicts slower than a baseline). Remap off moves nothing but leaves the attention layout's token
imbalance in memory; the time-balanced remap, capped by memory (assemble.memory_caps), evens it out
inside each node (not across nodes: a node running a long document's ring while the other nodes
take the short documents stays imbalanced). --zeppelin-balance-memory, which plans under a memory
cap instead, is portfolio/memory.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from megatron_zeppelin.planner.build.assemble import MEMORY_BALANCE, activation_weights
from megatron_zeppelin.planner.build.remap import linear_tokens
from megatron_zeppelin.planner.context import PlanContext
from megatron_zeppelin.spec.config import PLAN_RATE_UNITS_PER_S

TIE = 1e-9  # predictions this close (relative) are equal: their last bits depend on summation order
MEMORY_SLACK = 0.03


def faster(a: float, b: float) -> bool:
    """``a`` is a faster prediction than ``b`` beyond rounding (ties keep the first proposed, so the
    pick does not depend on the order of the batch's documents, which changes the last bits of sums).

    >>> faster(1.0, 1.0 + 1e-15), faster(1.0, 1.0 + 1e-6), faster(2.0, 1.0)
    (False, True, False)
    """
    return a < b * (1.0 - TIE)


class MemoryChoice:
    """The fastest plan offered, the fastest whose memory is balanced, and the fastest baseline
    shape: (seconds, plan, candidate) each, or None."""

    def __init__(self, ctx: PlanContext):
        self.best = self.fit = self.shape = None
        self.weights = activation_weights(ctx.cost)

    def offer(self, plan, candidate) -> None:
        t = plan.predicted_iteration_s
        if "shape" in candidate.placement.meta and (self.shape is None or faster(t, self.shape[0])):
            self.shape = (t, plan, candidate)  # a baseline's shape (portfolio/shapes.py)
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


PLAN_SHARE = 0.10  # default budget: this share of the predicted iteration (issue 54's goal)
MIN_BUDGET_MS = 50.0  # ...but never less: below it planning is hidden behind any step (plan-ahead)


@dataclass
class SearchBudget:
    """Zeppelin's search budget in work units (portfolio/budget.py sizes the candidates; the
    partitioner's own free rings are recorded, never cut nor spent): units left and what the search cut.
    ``units`` None: set at the first ``afford`` from ``ms`` (or the default share of the best
    prediction then) at ``rate`` units per second.

    >>> b = SearchBudget(units=100.0)
    >>> b.afford("cp2", 60), b.afford("cp4", 60), b.afford("cp8", 40), b.spent
    (True, False, True, 100.0)
    >>> b.cut_budget, b.meta()
    (['cp4'], {'cut_budget': 'cp4'})
    """
    units: Optional[float] = None
    ms: float = 0.0  # --zeppelin-plan-budget-ms; 0: PLAN_SHARE of the best prediction, >= MIN_BUDGET_MS
    rate: float = PLAN_RATE_UNITS_PER_S
    spent: float = 0.0
    partitioner: float = 0.0  # units of the partitioner's own rings, before the budget
    cut_bound: List[str] = field(default_factory=list)
    cut_budget: List[str] = field(default_factory=list)

    def settle(self, best_s: float) -> float:
        """The budget in units, fixed at the first call (the best prediction after the partitioner)."""
        if self.units is None:
            ms = self.ms if self.ms > 0 else max(MIN_BUDGET_MS, 1e3 * PLAN_SHARE * best_s)
            self.units = ms * 1e-3 * self.rate
        return self.units

    def charge(self, units: float) -> None:
        """Work done outside the budget (the partitioner's own variants): recorded, not spent."""
        self.partitioner += units

    def afford(self, label: str, units: float, best_s: float = float("inf")) -> bool:
        """Charge ``units`` for ``label`` if they fit what is left; else note the cut and refuse."""
        if self.spent + units > self.settle(best_s):
            self.cut_budget.append(label)
            return False
        self.spent += units
        return True

    def skipped(self, label: str) -> None:
        """``label`` was skipped for its lower bound."""
        self.cut_bound.append(label)

    def meta(self) -> Dict[str, str]:
        """The plan's meta notes of what was cut (none where nothing was)."""
        out = {}
        if self.cut_bound:
            out["cut_bound"] = ", ".join(self.cut_bound)
        if self.cut_budget:
            out["cut_budget"] = ", ".join(self.cut_budget)
        return out
