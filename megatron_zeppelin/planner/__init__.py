"""The planner: pure and deterministic. ``plan_batch`` turns the document lengths of one global
micro-batch into a Plan (see types.py) for a topology, hardware profile, model and strategy; a
``Planner`` does the same for every batch of a run, building what depends only on the run (the cost
model and the crossover lengths of the class thresholds) once.

No torch.distributed, no clock, no unseeded randomness; ties are broken by (length, index).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.model import ModelSpec
from megatron_zeppelin.spec.hardware import HardwareProfile
from megatron_zeppelin.spec.host import HostModel
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.spec.words import StrategyName
from megatron_zeppelin.planner.context import Placement, PlanContext
from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.planner.strategies import pick
from megatron_zeppelin.planner.types import Plan, PlanError
from megatron_zeppelin.planner.portfolio.memory import plan_memory_first
# The strategies' modules: importing them fills strategies.py's registry. Python runs this file
# before any module of the planner, so the registry is full wherever it is read.
from megatron_zeppelin.planner import baselines  # noqa: F401 -- the baselines register
from megatron_zeppelin.planner.partitioner import partition  # noqa: F401 -- Zeppelin registers

__all__ = ["plan_batch", "Planner", "make_context", "Plan", "PlanError", "PlanContext", "Placement", "CostModel"]


def make_context(topology: Topology, profile: HardwareProfile, model: ModelSpec,
                 config: Optional[ZeppelinConfig] = None, total_tokens: int = 0,
                 cost: Optional[CostModel] = None, *, host: Optional[HostModel] = None) -> PlanContext:
    """The context of one batch; ``cost``: a cost model of the same topology, profile, model and
    config to reuse (a Planner's), else a new one (with ``host``: ranks sharing one CPU, the CPU
    validation's; spec/host.py)."""
    config = config or ZeppelinConfig(gpus_per_node=topology.gpus_per_node)
    world = topology.world_size
    capacity = config.capacity_tokens or max(1, 2 * -(-total_tokens // world))
    cost = cost or cost_model_of(topology, profile, model, config, host)
    return PlanContext(topology, model, profile, config, cost, capacity)


def cost_model_of(topology: Topology, profile: HardwareProfile, model: ModelSpec, config: ZeppelinConfig,
                  host: Optional[HostModel] = None) -> CostModel:
    return CostModel(model, profile, topology, config.tp, config.recompute, config.sequence_parallel, host)


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
               config: Optional[ZeppelinConfig] = None, strategy: Optional[str] = None, *,
               host: Optional[HostModel] = None) -> Plan:
    """Plan one global micro-batch. ``strategy`` defaults to ``config.strategy``. A run planning
    many batches keeps a Planner instead (the same Plans, without rebuilding the run's cost model).
    ``host``: the ranks share one CPU (the CPU validation's; spec/host.py), None on GPUs."""
    return Planner(topology, profile, model, config, host=host).plan(lengths, strategy)


class Planner:
    """Plans the batches of one run (one topology, profile, model and config): the cost model, and
    the crossover lengths it keeps (CostModel.crossover_length), are built at the first batch and
    reused; every Plan equals plan_batch's for the same batch.

    >>> from megatron_zeppelin.spec.model import load_model
    >>> from megatron_zeppelin.spec.hardware import load_profile
    >>> prof = load_profile("a800")
    >>> planner = Planner(Topology(2, 8, prof.nics_per_node, prof.gpu_to_nic), prof, load_model("llama-7b"))
    >>> batches = ([30000, 900, 1200, 4000] * 8, [8000] * 20)
    >>> [planner.plan(b) == plan_batch(b, planner.topology, prof, planner.model) for b in batches]
    [True, True]
    """

    def __init__(self, topology: Topology, profile: HardwareProfile, model: ModelSpec,
                 config: Optional[ZeppelinConfig] = None, *, host: Optional[HostModel] = None):
        self.topology, self.profile, self.model = topology, profile, model
        self.config = config or ZeppelinConfig(gpus_per_node=topology.gpus_per_node)
        self.cost = cost_model_of(topology, profile, model, self.config, host)

    def plan(self, lengths: Sequence[int], strategy: Optional[str] = None) -> Plan:
        """The Plan of one global micro-batch; ``strategy`` defaults to the config's."""
        config = self.config
        name = strategy or config.strategy
        ZeppelinConfig(strategy=name)  # validates the name with a flag-naming error
        if hasattr(lengths, "dtype") and np.issubdtype(lengths.dtype, np.integer) and len(lengths) and lengths.min() > 0:
            total = int(lengths.sum())
            lengths = lengths.tolist()  # integers, all positive: check_lengths's per-element checks hold
            checked = True
        else:
            lengths = lengths.tolist() if hasattr(lengths, "tolist") else lengths
            total, checked = sum(int(x) for x in lengths), False
        ctx = make_context(self.topology, self.profile, self.model, config, total_tokens=total, cost=self.cost)
        lengths = check_lengths(lengths, ctx.capacity, self.topology.world_size, checked)
        if config.balance_memory and name == StrategyName.ZEPPELIN:
            return plan_memory_first(lengths, ctx)
        return pick(name, lengths, ctx)[0]
