"""ZeppelinConfig: every Zeppelin option, typed, frozen and validated.

Errors name the command-line flag to change. Spec is the lowest layer: the argparse bridge is
integration/args.py (``config_from_args``), and the strategies' code registers under the names
listed here (planner/strategies.py refuses a name that is not).

>>> ZeppelinConfig(routing="multi-nic").routing_enabled(nodes=2), ZeppelinConfig().routing_enabled(nodes=1)
(True, False)
>>> ZeppelinConfig(strategy="bogus")
Traceback (most recent call last):
...
megatron_zeppelin.spec.config.ConfigError: unknown strategy 'bogus' (set --zeppelin-strategy to one of zeppelin, packed_dp, static_cp, allgather_cp, hybrid_dp, dynamic_cp)
"""

from __future__ import annotations

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.recompute import Recompute
from megatron_zeppelin.spec.words import Accumulation, Comm, Routing, StrategyName

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Optional, Tuple

ROUTING = tuple(r.value for r in Routing)  # the plain words: --zeppelin-routing's choices
ACCUMULATION = tuple(a.value for a in Accumulation)  # --zeppelin-accumulation's choices
DEFAULT_ACCUMULATION = Accumulation.ROUNDS  # ZeppelinConfig.accumulation's default (why: there)



class PlanSharing(StrEnum):
    """Who plans each global micro-batch (``--zeppelin-plan-sharing``; integration/plan_share.py)."""
    EVERY_RANK = "every-rank"  # every rank of the domain plans it (the same plan: planning is pure)
    ONE_PER_DOMAIN = "one-per-domain"  # the domain's rank 0 plans it and broadcasts the Plan


PLAN_SHARING = tuple(m.value for m in PlanSharing)  # --zeppelin-plan-sharing's choices

# What --zeppelin-strategy accepts, in the order of tables and --compare: the words of StrategyName
# (spec/words.py). The planner's registry (planner/strategies.py) holds one strategy under each name.
STRATEGIES = tuple(m.value for m in StrategyName)


class ConfigError(ZeppelinError):
    pass


# Work units (planner/portfolio/budget.py) this planner does per second on the host that plans: it
# converts --zeppelin-plan-budget-ms to units, so the search cuts the same candidates on any machine.
# Measured on the project's 2-core host: the median over 54 plans of `benchmarks/bench_planner.py
# --budget-rate --repeats 3 --out results/rate51/plan_rate.json` (4.92e4, load average 1.4; by case
# 3.6e4-6.4e4), every unit the plan charged, the partitioner's recorded ones included. It was 3.19e4
# (results/budget/plan_rate.json, load average 11) before routed prediction got 2.5-2.9x faster.
PLAN_RATE_UNITS_PER_S = 4.9e4


@dataclass(frozen=True)
class ZeppelinConfig:
    balance: bool = False  # --zeppelin-balance: plan every micro-batch with Zeppelin
    strategy: StrategyName = StrategyName.ZEPPELIN  # --zeppelin-strategy
    gpus_per_node: int = 8  # --zeppelin-gpus-per-node
    nics_per_node: int = 0  # --zeppelin-nics-per-node (0 = one per GPU, or the profile's)
    gpu_nic_map: Tuple[int, ...] = field(default=())  # --zeppelin-gpu-nic-map
    cluster: str = "h200"  # --zeppelin-cluster: profile preset or YAML path
    routing: Routing = Routing.AUTO  # --zeppelin-routing: auto = multi-nic when the domain spans nodes
    remap: bool = True  # --zeppelin-remap / --no-zeppelin-remap
    capacity_tokens: int = 0  # --zeppelin-capacity-tokens: per-rank attention tokens, 0 = 2x the mean
    balance_memory: bool = False  # --zeppelin-balance-memory: every rank's tokens within 1.10x the mean
    cp_size: int = 0  # --zeppelin-cp-size: CP group size for static_cp/allgather_cp, 0 = best for the batch
    # --zeppelin-cp-comm-type: TE's cp_comm_type static_cp (and Zeppelin's static_cp shapes) may
    # use, p2p or a2a (Ulysses); None (auto) = the faster for the batch
    cp_comm: Optional[Comm] = None
    # --zeppelin-cp-a2a-size: a2a+p2p's a2a group size (Megatron's --hierarchical-context-parallel-sizes
    # a p: the a), 0 = every split that divides gpus_per_node and the heads
    cp_a2a_size: int = 0
    min_route_bytes: int = 0  # --zeppelin-min-route-bytes: 0 = derived from the profile
    # --zeppelin-relay-chunk-bytes: largest chunk of a routed piece; None = the profile's, 0 = unpipelined
    relay_chunk_bytes: Optional[int] = None
    debug_plan: bool = False  # --zeppelin-debug-plan: compare plan digests across ranks every step
    plan_ahead: bool = True  # --zeppelin-plan-ahead / --no-zeppelin-plan-ahead: plan batch k+1 while k trains
    # --zeppelin-plan-sharing: every rank plans each batch, or one rank per domain plans and
    # broadcasts it (the flag's default follows --zeppelin-plan-ahead: integration/args.py)
    plan_sharing: PlanSharing = PlanSharing.ONE_PER_DOMAIN
    # --zeppelin-plan-budget-ms: what Zeppelin's search may spend after its partitioner (in work
    # units at PLAN_RATE_UNITS_PER_S); 0 = 10% of the predicted iteration, at least 50 ms
    plan_budget_ms: float = 0.0
    tp: int = 1  # tensor-parallel size (from Megatron's --tensor-model-parallel-size)
    # activation recompute (from Megatron's --recompute-granularity / --recompute-modules;
    # spec/recompute.py): plans are predicted with the recomputed forward it runs. Given as a
    # Recompute or its text ("selective:core_attn", "full:block=4"), kept parsed.
    recompute: Recompute = Recompute()
    sequence_parallel: bool = False  # Megatron's --sequence-parallel: layouts split over TP along tokens
    # --zeppelin-accumulation: documents to micro-batches in data order, or jointly over the global
    # batch (planner/accumulation.py); it changes which lengths each Plan gets, never a Plan of them.
    # Default rounds: faster than data order in every accumulation and pipeline configuration of
    # docs/results.md; with one micro-batch per iteration the two are the same.
    accumulation: Accumulation = DEFAULT_ACCUMULATION

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy '{self.strategy}' (set --zeppelin-strategy to one of "
                              f"{', '.join(STRATEGIES)})")
        if self.routing not in ROUTING:
            raise ConfigError(f"unknown routing '{self.routing}' (set --zeppelin-routing to one of "
                              f"{', '.join(ROUTING)})")
        if self.gpus_per_node < 1:
            raise ConfigError(f"--zeppelin-gpus-per-node must be >= 1, got {self.gpus_per_node}")
        if self.nics_per_node < 0:
            raise ConfigError(f"--zeppelin-nics-per-node must be >= 0, got {self.nics_per_node}")
        if self.capacity_tokens < 0:
            raise ConfigError(f"--zeppelin-capacity-tokens must be >= 0, got {self.capacity_tokens}")
        if self.cp_size < 0 or (self.cp_size & (self.cp_size - 1)):
            raise ConfigError(f"--zeppelin-cp-size must be 0 (auto) or a power of two, got {self.cp_size}")
        if self.cp_comm is not None and self.cp_comm not in (Comm.P2P, Comm.A2A, Comm.A2A_P2P):
            raise ConfigError(f"--zeppelin-cp-comm-type must be auto, p2p, a2a or a2a+p2p, got {self.cp_comm}")
        if self.cp_a2a_size < 0 or self.cp_a2a_size == 1:
            raise ConfigError(f"--zeppelin-cp-a2a-size must be 0 (auto) or >= 2, got {self.cp_a2a_size}")
        if self.cp_comm is not None:
            object.__setattr__(self, "cp_comm", Comm(self.cp_comm))
        if self.min_route_bytes < 0:
            raise ConfigError(f"--zeppelin-min-route-bytes must be >= 0, got {self.min_route_bytes}")
        if self.relay_chunk_bytes is not None and self.relay_chunk_bytes < 0:
            raise ConfigError(f"--zeppelin-relay-chunk-bytes must be >= 0 (0: unpipelined relays), "
                              f"got {self.relay_chunk_bytes}")
        if not self.plan_budget_ms >= 0:
            raise ConfigError(f"--zeppelin-plan-budget-ms must be >= 0 (0: 10% of the predicted iteration), "
                              f"got {self.plan_budget_ms}")
        if self.tp < 1:
            raise ConfigError(f"--tensor-model-parallel-size must be >= 1, got {self.tp}")
        if self.sequence_parallel and self.tp == 1:
            raise ConfigError("--sequence-parallel needs --tensor-model-parallel-size > 1 (or drop it)")
        object.__setattr__(self, "strategy", StrategyName(self.strategy))  # members, from the flags' words
        object.__setattr__(self, "routing", Routing(self.routing))
        if self.accumulation not in ACCUMULATION:
            raise ConfigError(f"unknown accumulation '{self.accumulation}' (set --zeppelin-accumulation to one of "
                              f"{', '.join(ACCUMULATION)})")
        object.__setattr__(self, "accumulation", Accumulation(self.accumulation))
        if self.plan_sharing not in PLAN_SHARING:
            raise ConfigError(f"unknown plan sharing '{self.plan_sharing}' (set --zeppelin-plan-sharing to one of "
                              f"{', '.join(PLAN_SHARING)})")
        object.__setattr__(self, "plan_sharing", PlanSharing(self.plan_sharing))
        object.__setattr__(self, "gpu_nic_map", tuple(int(x) for x in self.gpu_nic_map))
        object.__setattr__(self, "recompute", Recompute.parse(self.recompute))

    def routing_enabled(self, nodes: int) -> bool:
        return self.routing == Routing.MULTI_NIC or (self.routing == Routing.AUTO and nodes > 1)

    def with_(self, **kw) -> "ZeppelinConfig":
        return replace(self, **kw)
