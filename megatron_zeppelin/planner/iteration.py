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

With pipeline parallelism (``stages`` = p > 1) the steps are micro-batches in flight under Megatron's
1F1B schedule (``one_f_one_b``): the layers split evenly, so a stage's share of step k is step k / p
(the stage step: the slowest domain rank of the stage, as each step's Plan prices it), forward and
backward split 1 : 2 (backward twice the forward's FLOPs), and each stage reduces its own 1/p of the
gradients after its last backward:

>>> Iteration((plan(3.0, 3.0),) * 4, stages=2).predicted_iteration_s   # (4 + 2 - 1) x 3 / 2, + 0.5 / 2
7.75
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from megatron_zeppelin.planner.types import Plan

BACKWARD_SHARE = 2.0 / 3.0  # of a step's seconds, when only the total is known: backward = 2 x forward FLOPs


def one_f_one_b(forward: Sequence[Sequence[float]], backward: Sequence[Sequence[float]]) -> float:
    """Seconds of one pipeline iteration under Megatron's non-interleaved 1F1B schedule, from each
    stage's forward and backward seconds of each micro-batch (``forward[stage][k]``).

    The order is Megatron-Core's ``forward_backward_pipelining_without_interleaving``
    (megatron/core/pipeline_parallel/schedules.py): stage i of p runs min(p - i - 1, m) warm-up
    forwards, then m - warm-up (forward k, backward j) pairs, then the remaining backwards; a forward
    waits for the same micro-batch's forward on the stage before, a backward for the same
    micro-batch's backward on the stage after (the last stage: for its own forward). Activations'
    point-to-point transfers are not timed. With equal micro-batches (f, b per stage) this is the
    bubble of Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
    Megatron-LM" (SC'21, arXiv 2104.04473, sec. 2.2.1): (m + p - 1) x (f + b), ideal m x (f + b);
    with per-micro-batch plans it is the micro-batches' sum on each stage plus the bubble they leave.

    >>> one_f_one_b([[1.0] * 8] * 4, [[2.0] * 8] * 4)          # p = 4, m = 8: (8 + 4 - 1) x 3
    33.0
    >>> one_f_one_b([[1.0, 1.0]], [[2.0, 2.0]])                  # one stage: the sum, no bubble
    6.0
    >>> one_f_one_b([[3.0, 1.0, 1.0, 1.0]] * 2, [[6.0, 2.0, 2.0, 2.0]] * 2)   # one heavy micro-batch of 4
    27.0
    >>> one_f_one_b([[1.5] * 4] * 2, [[3.0] * 4] * 2)   # the same work balanced over the micro-batches
    22.5
    """
    p, m = len(forward), len(forward[0]) if forward else 0
    order: List[List[Tuple[str, int]]] = []
    for i in range(p):
        warm = min(p - i - 1, m)
        ops = [("F", k) for k in range(warm)]
        for j in range(m - warm):
            ops += [("F", warm + j), ("B", j)]
        ops += [("B", k) for k in range(m - warm, m)]
        order.append(ops)
    end: Dict[Tuple[str, int, int], float] = {}
    free, pos, left = [0.0] * p, [0] * p, p * 2 * m
    while left:
        moved = False
        for i in range(p):
            while pos[i] < len(order[i]):
                kind, k = order[i][pos[i]]
                dep = (("F", i - 1, k) if i > 0 else None) if kind == "F" else (
                    ("B", i + 1, k) if i < p - 1 else ("F", i, k))
                if dep is not None and dep not in end:
                    break
                start = max(free[i], end[dep] if dep is not None else 0.0)
                free[i] = end[(kind, i, k)] = start + (forward if kind == "F" else backward)[i][k]
                pos[i] += 1
                left -= 1
                moved = True
        if not moved:  # cannot happen for the order above; a guard against a silent hang
            raise RuntimeError("1F1B schedule deadlocked")
    return max(free, default=0.0)


def pipeline_s(step_s: Sequence[float], stages: int) -> float:
    """``one_f_one_b`` of steps known by their total seconds (a Plan's prediction of all layers): the
    layers split evenly over ``stages``, each step's stage share split forward : backward as 1 : 2."""
    fwd = [[s * (1.0 - BACKWARD_SHARE) / stages for s in step_s]] * stages
    bwd = [[s * BACKWARD_SHARE / stages for s in step_s]] * stages
    return one_f_one_b(fwd, bwd)


@dataclass(frozen=True)
class Iteration:
    steps: Tuple[Plan, ...]  # one Plan per gradient-accumulation step, in order
    stages: int = 1  # pipeline stages (Megatron's --pipeline-model-parallel-size): 1F1B over the steps

    @property
    def first(self) -> Plan:
        return self.steps[0]

    @property
    def allreduce_s(self) -> float:
        """The DP gradient reduce one stage exposes: its 1/stages of the model's gradients."""
        return self.first.allreduce_s / self.stages

    @property
    def steps_s(self) -> float:
        """The steps' predicted seconds, back to back (each step waits for its slowest rank)."""
        return sum(p.predicted_iteration_s for p in self.steps)

    @property
    def step_s(self) -> float:
        """The mean step."""
        return self.steps_s / len(self.steps)

    @property
    def pipeline_s(self) -> float:
        """The steps as run: back to back, or in 1F1B over the pipeline stages (the bubble included)."""
        if self.stages == 1:
            return self.steps_s
        return pipeline_s([p.predicted_iteration_s for p in self.steps], self.stages)

    @property
    def predicted_iteration_s(self) -> float:
        """The whole iteration: every step, then the all-reduce (not overlapped, Megatron's default)."""
        return self.pipeline_s + self.allreduce_s

    @property
    def lower_bound_s(self) -> float:
        """Each step's lower bound, plus the all-reduce every strategy pays (with stages: the same
        bounds in 1F1B)."""
        bounds = [p.lower_bound_s for p in self.steps]
        return (sum(bounds) if self.stages == 1 else pipeline_s(bounds, self.stages)) + self.allreduce_s

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
