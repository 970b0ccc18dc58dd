"""One training iteration as Megatron logs it, predicted: its gradient-accumulation steps (each a
planned global micro-batch, one Plan) one after another, then the DP gradient all-reduce once.

A Plan prices one step (``Plan.predicted_iteration_s``: the slowest rank's forward and backward of one
global micro-batch; the planner's name predates accumulation) and keeps the all-reduce apart
(``Plan.allreduce_s``, the same for every step and strategy). With ``--global-batch-size G
--micro-batch-size M`` on R data-parallel ranks an iteration is G / (M x R) such steps: Megatron's log
line ("elapsed time per iteration") covers all of them and the reduce.

>>> from megatron_zeppelin.planner.types import Plan, Thresholds, RankCost
>>> from megatron_zeppelin.spec.topology import Topology
>>> def plan(*totals):
...     cost = tuple(RankCost(attention_s=t, linear_s=0.0, comm_exposed_s=0.0, remap_s=0.0) for t in totals)
...     return Plan("x", Topology(1, len(totals)), (), (), (), ((),) * len(totals), ((),) * len(totals), (), (),
...                 cost, 1.0, Thresholds(0, 0), allreduce_s=0.5)
>>> it = Iteration((plan(2.0, 1.0), plan(3.0, 3.0)))
>>> it.predicted_iteration_s, it.step_s, it.allreduce_s   # 2 + 3 s of steps, then the reduce
(5.5, 2.5, 0.5)
>>> round(it.imbalance, 3)                                  # (2 + 3) / (1.5 + 3)
1.111
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

from megatron_zeppelin.planner.types import Plan


@dataclass(frozen=True)
class Iteration:
    steps: Tuple[Plan, ...]  # one Plan per gradient-accumulation step, in order

    @property
    def first(self) -> Plan:
        return self.steps[0]

    @property
    def allreduce_s(self) -> float:
        return self.first.allreduce_s

    @property
    def steps_s(self) -> float:
        """The steps' predicted seconds, back to back (each step waits for its slowest rank)."""
        return sum(p.predicted_iteration_s for p in self.steps)

    @property
    def step_s(self) -> float:
        """The mean step."""
        return self.steps_s / len(self.steps)

    @property
    def predicted_iteration_s(self) -> float:
        """The whole iteration: every step, then the all-reduce (not overlapped, Megatron's default)."""
        return self.steps_s + self.allreduce_s

    @property
    def lower_bound_s(self) -> float:
        """Each step's lower bound, plus the all-reduce every strategy pays."""
        return sum(p.lower_bound_s for p in self.steps) + self.allreduce_s

    @property
    def imbalance(self) -> float:
        """Slowest-rank time over mean-rank time, summed over the steps (1 = no rank ever waits)."""
        mean = sum(p.predicted_iteration_s / p.imbalance for p in self.steps)
        return self.steps_s / mean if mean > 0 else 1.0

    @property
    def meta(self):
        return self.first.meta

    def class_counts(self) -> Dict[str, int]:
        """Documents per class over every step."""
        out: Dict[str, int] = {}
        for p in self.steps:
            for c, n in p.class_counts().items():
                out[c] = out.get(c, 0) + n
        return out
