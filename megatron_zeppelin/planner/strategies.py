"""Strategy registry: name -> function(lengths, PlanContext) -> Placement.

Modules are imported lazily so a strategy being edited cannot break the others' import.
"""

from __future__ import annotations

import importlib
from typing import Callable

from ..config import STRATEGIES

_WHERE = {
    "zeppelin": ("megatron_zeppelin.planner.partition", "plan_zeppelin"),
    "packed_dp": ("megatron_zeppelin.planner.baselines.packed_dp", "plan_packed_dp"),
    "static_cp": ("megatron_zeppelin.planner.baselines.static_cp", "plan_static_cp"),
    "allgather_cp": ("megatron_zeppelin.planner.baselines.allgather_cp", "plan_allgather_cp"),
    "hybrid_dp": ("megatron_zeppelin.planner.baselines.hybrid_dp", "plan_hybrid_dp"),
    "dynamic_cp": ("megatron_zeppelin.planner.baselines.dynamic_cp", "plan_dynamic_cp"),
}
assert set(_WHERE) == set(STRATEGIES)


def get_strategy(name: str) -> Callable:
    mod, fn = _WHERE[name]
    return getattr(importlib.import_module(mod), fn)
