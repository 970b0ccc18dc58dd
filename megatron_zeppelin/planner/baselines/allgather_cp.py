"""allgather_cp: Llama-3-style context parallelism (K/V all-gathered, not overlapped).

Same CP groups, packing and best-CP-size choice as static_cp (blocks of consecutive ranks, documents
token-balanced over DP groups, 2*cp chunks per document with member i holding chunks i and 2cp-1-i for
causal balance), but each group is a ``Ring(comm="allgather")``: every member gathers the whole K/V of
its group once per layer, then attends its query chunks against their whole prefix; the gather (and
the reduce-scatter of dK/dV in the backward) is not overlapped with compute.

>>> from megatron_zeppelin.planner.testing import toy_context
>>> from megatron_zeppelin.spec.config import ZeppelinConfig
>>> ctx = toy_context(gpus=4, config=ZeppelinConfig(gpus_per_node=4, cp_size=4))
>>> from megatron_zeppelin.planner.strategies import pick
>>> p, _ = pick("allgather_cp", [8, 6, 4], ctx)
>>> [(r.ranks, r.comm, r.docs) for r in p.rings], p.meta.cp_size
([((0, 1, 2, 3), 'allgather', (0, 1, 2))], 4)
"""

from __future__ import annotations

from typing import Iterable, Sequence

from megatron_zeppelin.planner.context import PlanContext
from megatron_zeppelin.planner.strategies import Candidate, strategy
from megatron_zeppelin.planner.baselines.static_cp import cp_candidates
from megatron_zeppelin.spec.words import Comm, StrategyName


@strategy(StrategyName.ALLGATHER_CP, order=3, searches=True)
def plan_allgather_cp(lengths: Sequence[int], ctx: PlanContext, search=None) -> Iterable[Candidate]:
    return cp_candidates(lengths, ctx, Comm.ALLGATHER)
