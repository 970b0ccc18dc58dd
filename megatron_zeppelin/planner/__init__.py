"""The planner: pure and deterministic. ``plan_batch`` turns the document lengths of one global
micro-batch into a Plan (see types.py) for a topology, hardware profile, model and strategy.

No torch.distributed, no clock, no unseeded randomness; ties are broken by (length, index).
"""

from __future__ import annotations

import gc
from typing import Optional, Sequence

import numpy as np

from ..config import ZeppelinConfig
from ..model_spec import ModelSpec
from ..profile import HardwareProfile
from ..recompute import Recompute
from ..topology import Topology
from .context import Placement, PlanContext
from .cost_model import CostModel
from .strategies import pick
from .types import Plan, PlanError

__all__ = ["plan_batch", "make_context", "Plan", "PlanError", "PlanContext", "Placement", "CostModel"]


def make_context(topology: Topology, profile: HardwareProfile, model: ModelSpec,
                 config: Optional[ZeppelinConfig] = None, total_tokens: int = 0) -> PlanContext:
    config = config or ZeppelinConfig(gpus_per_node=topology.gpus_per_node)
    world = topology.world_size
    capacity = config.capacity_tokens or max(1, 2 * -(-total_tokens // world))
    cost = CostModel(model, profile, topology, config.tp, Recompute.parse(config.recompute), config.sequence_parallel)
    return PlanContext(topology, model, profile, config, cost, capacity)


def check_lengths(lengths: Sequence[int], capacity: int, world: int, checked: bool = False) -> list:
    """The lengths as a list of ints; ``checked``: they already are, all positive (from an integer array)."""
    if len(lengths) == 0:
        raise PlanError("empty batch: no documents to plan (check --dataset / --global-batch-tokens)")
    out = lengths if checked else []
    for i, L in enumerate(() if checked else lengths):
        if isinstance(L, bool) or int(L) != L:
            raise PlanError(f"document {i} has non-integer length {L!r}")
        if L <= 0:
            raise PlanError(f"document {i} has length {L}: lengths must be positive")
        out.append(int(L))
    if max(out) > capacity * world:
        i = out.index(max(out))
        raise PlanError(f"document {i} has {max(out)} tokens but the domain holds at most {capacity * world} "
                        f"({world} ranks x {capacity} tokens): raise --zeppelin-capacity-tokens "
                        f"to at least {-(-max(out) // world)} or add ranks")
    return out


def plan_batch(lengths: Sequence[int], topology: Topology, profile: HardwareProfile, model: ModelSpec,
               config: Optional[ZeppelinConfig] = None, strategy: Optional[str] = None) -> Plan:
    """Plan one global micro-batch. ``strategy`` defaults to ``config.strategy``."""
    config = config or ZeppelinConfig(gpus_per_node=topology.gpus_per_node)
    name = strategy or config.strategy
    ZeppelinConfig(strategy=name)  # validates the name with a flag-naming error
    if hasattr(lengths, "dtype") and np.issubdtype(lengths.dtype, np.integer) and len(lengths) and lengths.min() > 0:
        total = int(lengths.sum())
        lengths = lengths.tolist()  # integers, all positive: check_lengths's per-element checks hold
        checked = True
    else:
        lengths = lengths.tolist() if hasattr(lengths, "tolist") else lengths
        total, checked = sum(int(x) for x in lengths), False
    ctx = make_context(topology, profile, model, config, total_tokens=total)
    lengths = check_lengths(lengths, ctx.capacity, topology.world_size, checked)
    # Planning a large batch allocates tens of thousands of small objects (the Plan's documents and
    # segments) and no cycles: the cyclic collector's passes over them are a fifth of its time.
    paused = gc.isenabled()
    gc.disable()
    try:
        return pick(name, lengths, ctx)[0]
    finally:
        if paused:
            gc.enable()
