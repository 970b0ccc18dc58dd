"""What a strategy gets (PlanContext) and what it returns (Placement) before assembly into a Plan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.model import ModelSpec
from megatron_zeppelin.spec.hardware import HardwareProfile
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.planner.types import DocPlan, Ring, Thresholds


@dataclass(frozen=True)
class PlanContext:
    topology: Topology
    model: ModelSpec
    profile: HardwareProfile
    config: ZeppelinConfig
    cost: CostModel
    capacity: int  # per-rank attention-layout token capacity
    # --zeppelin-balance-memory (memory_choice.plan_memory_first): ``capacity`` is the memory-balance
    # cap, which both layouts of every candidate must fit, as a set --zeppelin-capacity-tokens
    memory_first: bool = False
    # The batch's routed steps (build/routing.py ``route_schedule``) and priced exchanges
    # (cost/predict.py ``_Attention``: hops and their parts by the ops they come from): candidates
    # sharing a queue's rings (a placement and its +a2a version) route and price them once. A memo:
    # no field of a Plan depends on what it holds, and it lives as long as the batch's context.
    exchanges: Dict = field(default_factory=dict, compare=False, repr=False)


@dataclass
class Placement:
    """A strategy's decision: document classes, rings and owners. Rings may come in any order;
    assembly puts inter rings before intra rings and renumbers them."""
    docs: List[DocPlan]
    rings: List[Ring]
    thresholds: Thresholds
    remap: bool = False  # run the remapping layer (token-balanced linear layout)
    routing: bool = False  # route inter-node ring messages over all NICs
    # With remap: give each rank of a node the linear tokens that equalise its attention + exposed
    # communication + linear time (node totals kept: NVLink moves only), not an equal token count.
    balance_linear: bool = False
    meta: Dict[str, str] = field(default_factory=dict)
    # The local documents in document order, where the strategy has them at little cost (the
    # partitioner, from its owners): ``docs`` are then in document order too. Assembly derives them
    # otherwise (a pass over every document).
    local: Optional[List[DocPlan]] = None
    # Some DocPlan.padded is set: prediction charges the pad rows (planner/build/padding.py)
    padded: bool = False
