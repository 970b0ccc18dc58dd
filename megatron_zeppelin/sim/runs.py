"""One benchmark configuration: a *run* of N batches, planned with each variant, each plan simulated.

A configuration is a training run: ``batches`` global batches (default 16) sampled from the dataset
(batch b with seed ``seed + b``). Run-level settings are fixed for the whole run, as their users must
fix them before training: a fixed-CP baseline's CP size (Megatron's ``--context-parallel-size``) and
dynamic_cp's ``max_seqlen_per_dp_cp_rank``. Each such setting is searched over the run: every
candidate value is planned and simulated on every batch, and the *deployed* value is the one with
the least mean iteration time among those that never run out of memory on any batch of the run.
The *oracle* column keeps the per-batch best value (tuned per batch, with hindsight): an upper
bound on the baseline, not something a user can deploy. Zeppelin and the baselines without
run-level settings (packed_dp, hybrid_dp) plan each batch themselves; their two columns agree.

Gradient accumulation (``micro_batches`` > 1, from a matrix's ``global_batch_tokens``): each batch
of the run is one iteration of Megatron's ``--global-batch-size`` split into ``micro_batches``
global micro-batches of ``tokens_per_gpu`` x ranks tokens each (micro-batch m of batch b sampled
with seed ``seed + b x micro_batches + m``; one micro-batch is today's batch). Every strategy plans
each micro-batch on its own, at the run's setting; a rank's iteration is the sum over its
micro-batches, then the DP gradient reduce once (sim/iteration.py ``accumulate``). A rank holds one
micro-batch's activations at a time: peak memory is the largest micro-batch's.

Activation recompute per strategy (``recompute_per_strategy``, a matrix's ``recompute:
per_strategy``): the recompute joins the run-level settings. For each setting a strategy climbs
spec/recompute.py's LADDER from the fastest rung, each rung's memory capacity binding it, and keeps
the first rung at which every batch of the run fits (a slower rung only repeats more of the forward
for the same plan shape); the deployed (setting, recompute) pair is again the least mean time.
Rungs whose capacity is below the mean tokens per GPU are skipped: no plan can fit them. A variant
whose plans read the capacity (``CAPACITY_PLANNED``: Zeppelin's, hybrid_dp's groups) has no fixed
plan shape: a slower rung's larger capacity may split fewer documents. Past its first rung that fits
it also tries the rung of the fastest fixed-shape variant of the configuration (run first): where
capacity paid for the variant to beat, it may pay for this one. Every rung would cost each Zeppelin
variant a planning of every micro-batch per rung (2-4x the accumulation studies' time:
results/s60/README.md). A rung tried can only lower the variant's deployed time, never raise it.

A *variant* is a strategy, or one of the paper's ablation steps expressed as a Plan:

- ``static_cp+routing``: TE-style CP with the routing layer on (routing only);
- ``zeppelin-noremap``: Zeppelin's partitioning and engine without the remapping layer;
- ``zeppelin-noulysses``: Zeppelin without its own a2a (Ulysses) intra rings
  (partitioner/ulysses_rings.py): what they add;
- ``zeppelin``: everything.

Tensor parallelism: the domain is one TP slice, so a node holds gpus_per_node / tp of its ranks and
(as the slices share the node's NICs evenly) nics_per_node / tp NICs at full bandwidth.

>>> from megatron_zeppelin.spec.hardware import load_profile
>>> domain_topology(load_profile("a800"), nodes=2, tp=2).describe()
'2 node(s) x 4 GPU(s), 2 NIC(s)/node, gpu->nic [0, 0, 1, 1]'
>>> deployed_and_oracle({2: [1.0, 3.5], 4: [2.0, 2.0], 8: [0.5, None]})
(4, [2.0, 2.0], [8, 4])
>>> deployed_and_oracle({8: [0.5, None]})
(None, None, [8, None])
>>> spec = RunSpec("s", "a800", "llama-7b", 1, "arxiv", 65536, 2, 4096, batches=2, global_batch_tokens=1 << 20,
...                micro_batches=8)
>>> spec.key(), [len(steps) for steps in run_steps(spec, 16)]
('s/a800/llama-7b-tp1/arxiv/ctx64K/2n/gbs1M/seed0', [8, 8])
>>> run_steps(dataclasses.replace(spec, micro_batches=1), 16) == [[b] for b in run_lengths(spec, 16)]
True
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from megatron_zeppelin.spec.config import STRATEGIES, ZeppelinConfig
from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.sim.attribution import count_kinds
from megatron_zeppelin.sim.iteration import SimOptions, accumulate, pipeline, simulate
from megatron_zeppelin.sim.dominated import DOMINATED, Beyond, Dominated
from megatron_zeppelin.sim.gpu_terms import without
from megatron_zeppelin.sim.perturb import TERMS, factors, perturbed
from megatron_zeppelin.sim.memory_fit import domain_topology, memory_tokens  # noqa: F401 -- domain_topology re-exported
from megatron_zeppelin.spec.memory import RECOMPUTE_LADDER
from megatron_zeppelin.planner import cost_model_of
from megatron_zeppelin.planner.accumulation import ASSIGNING, JOINT_STRATEGIES, joint_steps
from megatron_zeppelin.planner.cost.predict import lower_bound
from megatron_zeppelin.planner.baselines.static_cp import a2a_heads_problem, a2a_p2p_problem
from megatron_zeppelin.spec.words import Accumulation, Comm, Link, StrategyName

# Zeppelin with another --zeppelin-accumulation than its default (``zeppelin`` itself: rounds; planner/accumulation.py)
DATA_ORDER = "zeppelin+data_order"  # each micro-batch planned as the loader read it
JOINT = "zeppelin+joint"
BY_LENGTH = "zeppelin+by_length"
ROUNDS = "zeppelin+rounds"  # the default's own name, for `zeppelin simulate --strategy`
ASSIGNED = {DATA_ORDER: Accumulation.DATA_ORDER, JOINT: Accumulation.JOINT, BY_LENGTH: Accumulation.BY_LENGTH,
            ROUNDS: Accumulation.ROUNDS}  # Zeppelin's variants by accumulation
PARTITIONER = "zeppelin-partitioner"  # Zeppelin with the paper's partitioner alone (no portfolio of shapes)
# Zeppelin's variants: no baseline
ABLATIONS = ("static_cp+routing", "zeppelin-noremap", "zeppelin-noulysses", DATA_ORDER, JOINT, BY_LENGTH, ROUNDS,
             PARTITIONER)
VARIANTS = STRATEGIES + ABLATIONS


def regrouping(variant: str, config) -> Optional[Accumulation]:
    """The accumulation that regroups ``variant``'s micro-batches: its own (``ASSIGNED``), the config's
    for Zeppelin itself (``JOINT_STRATEGIES``; default rounds), None where they keep data order.

    >>> from megatron_zeppelin.spec.config import ZeppelinConfig
    >>> c = ZeppelinConfig(gpus_per_node=8)
    >>> regrouping("zeppelin", c), regrouping(DATA_ORDER, c), regrouping(JOINT, c), regrouping("dynamic_cp", c)
    ('rounds', None, 'joint', None)
    """
    how = ASSIGNED.get(variant) or (config.accumulation if variant in JOINT_STRATEGIES else None)
    return how if how in ASSIGNING else None
CP_VARIANTS = ("static_cp", "allgather_cp", "static_cp+routing")
# Strategies their system refuses to run with pipeline stages: simulated as if it ran them (what it
# would take), but not deployable there, so neither a deployed nor an oracle baseline (sim/matrix.py).
NO_PIPELINE = {"dynamic_cp": "Megatron-LM's hybrid context parallelism asserts pipeline_model_parallel_size "
                             "== 1 (megatron/training/arguments.py, 'Hybrid context parallelism not supported "
                             "with pipeline parallelism', in 0.19 and its dev branch)"}
# Variants whose plans read the capacity (not only checked against it): past the first rung that fits
# they try the rung the fastest other variant deployed (module doc)
CAPACITY_PLANNED = ("zeppelin", "hybrid_dp", "zeppelin-noremap", "zeppelin-noulysses", PARTITIONER) + tuple(ASSIGNED)
DEFAULT_BATCHES = 16
AUTO = "auto"  # the setting of a variant without run-level settings: it plans each batch itself
# Numeric fields of a batch's record averaged over the run.
_MEAN_FIELDS = ("iteration_s", "recompute_s", "predicted_s", "lower_bound_s", "allreduce_s", "forward_s", "backward_s", "head_s",
                "max_nic_util", "nic_bytes", "nvlink_bytes", "plan_s", "sim_s", "time_imbalance",
                "memory_imbalance", "memory_imbalance_attention", "memory_imbalance_linear", "peak_activation_GB",
                "documents", "tokens", "max_length")


@dataclass(frozen=True)
class RunSpec:
    study: str
    cluster: str
    model: str
    tp: int
    dataset: str
    context: int  # longest document (Megatron cuts longer ones), tokens
    nodes: int
    tokens_per_gpu: int  # global batch = tokens_per_gpu x domain ranks
    seed: int = 0
    capacity: int = 0  # per-rank token capacity every strategy must fit (memory); 0 = the planner's default
    batches: int = DEFAULT_BATCHES  # batches of the run
    recompute: str = "none"  # activation recompute of the run (spec/recompute.py), the same for every strategy
    regime: str = "fixed"  # "memory": the batch memory allows (capacity binds); "fixed": tokens_per_gpu as set
    balance_memory: bool = False  # Zeppelin planned with --zeppelin-balance-memory (memory_choice.plan_memory_first)
    global_batch_tokens: int = 0  # Megatron's --global-batch-size in tokens; 0: one micro-batch per iteration
    micro_batches: int = 1  # gradient-accumulation steps per iteration, each tokens_per_gpu x ranks tokens
    recompute_per_strategy: bool = False  # each strategy climbs the recompute ladder itself (module doc)
    pipeline: int = 1  # pipeline stages over ``nodes`` (module doc); the domain is one stage's DP ranks
    profile_error: float = 0.0  # plan with the profile off by up to +-this per term (sim/perturb.py), simulate true
    profile_seed: int = 0  # the perturbation's seed (with profile_error)
    profile_terms: str = ""  # the perturbed terms, "+"-joined (sim/perturb.py TERMS); "": every term
    gpu_term_off: str = "nothing"  # a GPU cost term turned off in the true profile (sim/gpu_terms.py)

    def key(self) -> str:
        regime = "/memory" if self.regime == "memory" else ""
        balanced = "/balance-memory" if self.balance_memory else ""
        gbs = f"/gbs{_tokens_label(self.global_batch_tokens)}" if self.global_batch_tokens else ""
        rc = "/rc-per-strategy" if self.recompute_per_strategy else ""
        err = (f"/err{self.profile_error:g}-s{self.profile_seed}" + (f"-{self.profile_terms}" if self.profile_terms
                                                                      else "") if self.profile_error else "")
        pp = f"/pp{self.pipeline}" if self.pipeline > 1 else ""
        off = f"/no-{self.gpu_term_off}" if self.gpu_term_off != "nothing" else ""
        return (f"{self.study}/{self.cluster}/{self.model}-tp{self.tp}/{self.dataset}/ctx{self.context // 1024}K/"
                f"{self.nodes}n{pp}{regime}{balanced}{gbs}{rc}{err}{off}/seed{self.seed}")

    def label(self) -> str:
        """Short, distinguishable label for plots and tables."""
        tp = f" tp{self.tp}" if self.tp > 1 else ""
        regime = " mem" if self.regime == "memory" else f" {self.tokens_per_gpu // 1024}K/GPU"
        gbs = (f" gbs {_tokens_label(self.global_batch_tokens)} x{self.micro_batches}"
               if self.global_batch_tokens else "")
        err = (f" err{self.profile_error:g}~{self.profile_seed}" + (f":{self.profile_terms}" if self.profile_terms
                                                                      else "") if self.profile_error else "")
        pp = f" pp{self.pipeline}" if self.pipeline > 1 else ""
        off = f" no-{self.gpu_term_off}" if self.gpu_term_off != "nothing" else ""
        return (f"{self.cluster} {self.model}{tp} {self.dataset} {self.context // 1024}K {self.nodes}n{pp}{regime}{gbs}"
                f"{err}{off}")

    @property
    def domain_nodes(self) -> int:
        """The nodes of one pipeline stage: its DP ranks are the domain every micro-batch is planned on."""
        return self.nodes // self.pipeline


def _tokens_label(n: int) -> str:
    """1M, 4M, 512K, or the count itself."""
    for unit, suffix in ((1 << 20, "M"), (1 << 10, "K")):
        if n >= unit and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def make_plan(variant: str, lengths: Sequence[int], topo: Topology, profile, model, config: ZeppelinConfig,
              setting: Optional[int] = None):
    """The plan of ``variant`` for one batch; ``setting`` is its run-level value (CP size, or
    dynamic_cp's max_seqlen_per_dp_cp_rank), None for the strategy's own per-batch choice."""
    from megatron_zeppelin.planner import make_context, plan_batch
    from megatron_zeppelin.planner.build.assemble import assemble
    from megatron_zeppelin.planner.baselines.static_cp import plan_static_cp
    from megatron_zeppelin.planner.strategies import choose
    if setting == AUTO:
        setting = None
    if setting is not None and variant in CP_VARIANTS:
        # TE's cp_comm_type is fixed for a run like the CP size: "a2a:N" is a2a at size N, a bare N
        # the variant's own kind (p2p for static_cp)
        # "a2a+p2p:N:A" TE's hierarchical a2a+p2p at size N in a2a groups of A
        comm, _, size = str(setting).rpartition(":")
        if comm.startswith(Comm.A2A_P2P + ":"):
            comm, size, a = Comm.A2A_P2P, comm.split(":")[1], int(size)
            config = config.with_(cp_a2a_size=a)
        config = config.with_(cp_size=int(size))
        if variant == "static_cp":
            config = config.with_(cp_comm=Comm(comm or Comm.P2P))
    if variant == "dynamic_cp" and setting is not None:
        from megatron_zeppelin.planner.baselines.dynamic_cp import dynamic_cp_placement
        ctx = make_context(topo, profile, model, config, total_tokens=sum(lengths))
        return assemble(variant, list(lengths), ctx, dynamic_cp_placement(list(lengths), ctx, int(setting)))
    if variant in STRATEGIES or variant in ASSIGNED:  # ASSIGNED: a Zeppelin plan of regrouped lengths
        return plan_batch(lengths, topo, profile, model, config, strategy=StrategyName.ZEPPELIN
                          if variant in ASSIGNED else variant)
    if variant == PARTITIONER:  # the partitioner's own candidates: the search stops where the shapes begin
        ctx = make_context(topo, profile, model, config, total_tokens=sum(lengths))
        return choose("zeppelin", list(lengths), ctx, _partitioner_only)[0]
    if variant == "zeppelin-noremap":
        return plan_batch(lengths, topo, profile, model, config.with_(remap=False), strategy="zeppelin")
    if variant == "zeppelin-noulysses":  # Zeppelin's pick without the candidates with a2a intra rings
        from megatron_zeppelin.planner.partitioner.partition import zeppelin_candidates
        ctx = make_context(topo, profile, model, config, total_tokens=sum(lengths))

        def own(lengths, ctx, search):
            return (c for c in zeppelin_candidates(lengths, ctx, search) if not c.label.endswith("+a2a"))
        return choose(StrategyName.ZEPPELIN, list(lengths), ctx, own)[0]
    if variant == "static_cp+routing":  # static_cp's candidates with routing on, picked as every strategy's
        ctx = make_context(topo, profile, model, config, total_tokens=sum(lengths))

        def routed(lengths, ctx, search):
            for c in plan_static_cp(lengths, ctx, search):
                if c.placement is not None and all(r.comm == Comm.P2P for r in c.placement.rings):
                    c.placement.routing = topo.nodes > 1  # the a2a kinds run unrouted, as in Zeppelin's shapes
                yield c
        return choose(variant, list(lengths), ctx, routed)[0]
    raise ZeppelinError(f"unknown variant '{variant}' (strategies in the matrix must be among {', '.join(VARIANTS)})")


def _partitioner_only(lengths, ctx, search):
    """Zeppelin's candidates without the portfolio's fixed shapes: the paper's partitioner, free and
    aligned rings (partition.py ``zeppelin_candidates(shapes=False)``)."""
    from megatron_zeppelin.planner.partitioner.partition import zeppelin_candidates
    return zeppelin_candidates(lengths, ctx, search, shapes=False)


def run_settings(variant: str, world: int, capacity: int, context: int, cp_sizes: Sequence[int],
                 a2a_ok: Callable[[int], bool] = lambda cp: False,
                 hier_ok: Callable[[int, int], bool] = lambda cp, a: False) -> List:
    """The run-level values a user could deploy for ``variant``: CP sizes dividing the domain for the
    fixed-CP baselines (``cp_sizes``, or every power of two and the whole domain), and for static_cp
    also "a2a:N" (TE's a2a at CP size N > 1, where ``a2a_ok(N)``: N divides the heads); dynamic_cp's
    max_seqlen_per_dp_cp_rank from the per-rank capacity down by halves while the largest
    power-of-two group still holds a context-long document; [AUTO] for variants without one."""
    from megatron_zeppelin.planner.baselines.cp_groups import cp_sizes as all_cp
    if variant in CP_VARIANTS:
        sizes = [cp for cp in (cp_sizes or all_cp(world)) if cp >= 1 and world % cp == 0]
        if variant != "static_cp":
            return sizes
        return (sizes + [f"a2a:{cp}" for cp in sizes if cp > 1 and a2a_ok(cp)]  # and a2a+p2p:N:A where hier_ok(N, A)
                + [f"{Comm.A2A_P2P}:{cp}:{a}" for cp in sizes for a in range(2, cp) if cp % a == 0 and hier_ok(cp, a)])
    if variant == "dynamic_cp":
        top = 1 << (world.bit_length() - 1)
        out, m = [], capacity
        while m >= max(1, -(-context // top)) and len(out) <= world.bit_length():
            out.append(m)
            m //= 2
        return out or [capacity]
    return [AUTO]


def deployed_and_oracle(times: Dict) -> Tuple[Optional[object], Optional[List[float]], List]:
    """From {setting: [seconds per batch, None where it runs out of memory]}: the deployed setting
    (least mean among those that fit every batch; ties: the first) and its times, and the per-batch
    best setting (None where no setting fits that batch)."""
    if not times:
        return None, None, []
    fits = [(sum(ts) / len(ts), k, s) for k, (s, ts) in enumerate(times.items()) if all(t is not None for t in ts)]
    dep = min(fits)[2] if fits else None
    n = len(next(iter(times.values())))
    oracle = []
    for b in range(n):
        ok = [(ts[b], k, s) for k, (s, ts) in enumerate(times.items()) if ts[b] is not None]
        oracle.append(min(ok)[2] if ok else None)
    return dep, (times[dep] if dep is not None else None), oracle


class _Rounds:
    """dynamic_cp's HDP rounds as one batch's result: iteration = the sum of the rounds' (a DP x CP
    barrier after each) + one DP all-reduce; per-rank costs and layouts of the busiest round for
    balance; every document's tokens for memory (a rank holds one round at a time)."""

    def __init__(self, plans, results):
        self.plans, self.results = plans, results
        last = results[-1]
        self.iteration_s = sum(r.iteration_s for r in results)
        self.allreduce_exposed_s = last.allreduce_exposed_s
        self.forward_s = sum(r.forward_s for r in results)
        self.backward_s = sum(r.backward_s for r in results)
        self.head_s = sum(r.head_s for r in results)
        self.max_nic_util = max(r.max_nic_util for r in results)
        self.link_bytes = {k: sum(r.link_bytes.get(k, 0.0) for r in results) for k in (Link.NIC, Link.NVLINK)}
        self.recompute_s = sum(r.recompute_s for r in results)


def simulate_rounds(lengths, topo, profile, model, config, mslpr: int, tp: int, options: SimOptions = None,
                    plan_profile=None, beyond: Optional[float] = None):
    """(the merged plan, _Rounds) of dynamic_cp run as Megatron runs it: each HDP round planned
    (with ``plan_profile``, default ``profile``) and simulated on its own (no DP all-reduce but
    after the last), times summed. ``beyond``: ``_rounds_simulated``'s."""
    from dataclasses import replace as dc_replace

    from megatron_zeppelin.planner import make_context
    from megatron_zeppelin.planner.baselines.dynamic_cp import dynamic_cp_placement, round_placements
    ctx = make_context(topo, plan_profile or profile, model, config, total_tokens=sum(lengths))
    whole = _Unpredicted(ctx, [(list(lengths), dynamic_cp_placement(list(lengths), ctx, mslpr))], beyond)
    rounds = _Unpredicted(ctx, [([int(lengths[i]) for i in docs], pl)
                                for docs, pl in round_placements(list(lengths), ctx, mslpr)], beyond)
    rr = _Rounds(rounds.plans(), _rounds_simulated(rounds.plans(), profile, model, tp, options or SimOptions(), beyond))
    merged = whole.predicted()[0]
    rr.plans = rounds.predicted()
    # The prediction of the rounds run one after another (each from a barrier), for the record.
    merged_rounds = dc_replace(merged, cost=tuple(_sum_costs([p.cost for p in rr.plans])))
    return merged_rounds, rr


class _Unpredicted:
    """dynamic_cp's plans of some placements ([(lengths, placement)]); where the setting may stop
    early (``beyond``: sim/dominated.py) assembled without their prediction first (what it costs
    most of; the simulator does not read it, and the memory check runs as always), and predicted
    only once the simulation has not stopped: the same plans."""

    def __init__(self, ctx, placed, beyond: Optional[float]):
        from megatron_zeppelin.planner.build.assemble import assemble, prepare
        self.ctx, self.placed, early = ctx, placed, beyond is not None
        self.prepared = [prepare(ctx, pl, costs=not early) for _, pl in placed]
        self._plans = [assemble("dynamic_cp", ls, ctx, pl, prepared=pre, predicted=not early)
                       for (ls, pl), pre in zip(placed, self.prepared)]
        self._predicted = None if early else self._plans

    def plans(self):
        return self._plans

    def predicted(self):
        from megatron_zeppelin.planner.build.assemble import assemble
        if self._predicted is None:
            self._predicted = [assemble("dynamic_cp", ls, self.ctx, pl, prepared=pre)
                               for (ls, pl), pre in zip(self.placed, self.prepared)]
        return self._predicted


def _rounds_simulated(plans, profile, model, tp: int, options: SimOptions, beyond: Optional[float] = None):
    """Each round's SimResult, one after the other (the DP all-reduce after the last only). Every
    round is planned before (a round that does not fit is an error before anything is simulated);
    ``beyond``: raise sim/dominated.py ``Beyond`` once the rounds so far take longer."""
    from dataclasses import replace as dc_replace
    results, so_far = [], 0.0
    for k, plan in enumerate(plans):
        o = options if k == len(plans) - 1 else dc_replace(options, allreduce=False)
        results.append(simulate(plan, profile, model, tp=tp, options=o,
                                beyond=None if beyond is None else beyond - so_far))
        so_far += results[-1].iteration_s
        if beyond is not None and so_far > beyond:
            raise Beyond(so_far)
    return results


def _sum_costs(costs):
    """Per rank, the sum over rounds of its own work (the barriers' waiting is not in it: the
    prediction of the rounds is the sum of each round's busiest rank, _batch_record)."""
    from megatron_zeppelin.planner.types import RankCost
    world = len(costs[0])
    out = [[0.0, 0.0, 0.0, 0.0] for _ in range(world)]
    for c in costs:
        for r, x in enumerate(c):
            o = out[r]
            o[0] += x.attention_s
            o[1] += x.linear_s
            o[2] += x.comm_exposed_s
            o[3] += x.remap_s
    return [RankCost(*o) for o in out]


def run_lengths(spec: RunSpec, world: int) -> List[List[int]]:
    from megatron_zeppelin.data.workloads import sample_batch
    return [[int(x) for x in sample_batch(spec.dataset, spec.tokens_per_gpu * world, spec.seed + b,
                                          max_len=spec.context)] for b in range(spec.batches)]


def run_steps(spec: RunSpec, world: int) -> List[List[List[int]]]:
    """Per batch (iteration) of the run, its micro-batches' document lengths (module doc); with one
    micro-batch, run_lengths's batches."""
    from megatron_zeppelin.data.workloads import sample_batch
    m = spec.micro_batches
    return [[[int(x) for x in sample_batch(spec.dataset, spec.tokens_per_gpu * world, spec.seed + b * m + k,
                                           max_len=spec.context)] for k in range(m)] for b in range(spec.batches)]


def _batch_record(plans, res, spec, model, profile, plan_s, sim_s, recompute: str, bound_cost=None) -> Dict:
    """A batch's plans (one per micro-batch) and simulated iteration (the activation recompute
    ``recompute`` is in both: the plan is priced with it, the simulator runs the recomputed forward
    in each layer's backward; ``recompute_s`` is the busiest rank's recomputed work) and the plans'
    time and memory balance. Each micro-batch (and each of dynamic_cp's rounds) waits for its
    slowest rank; a rank holds one of them at a time. ``lower_bound_s``: the plans' micro-batches
    perfectly balanced (planner/cost/predict.py ``lower_bound``) priced by ``bound_cost`` (default
    each plan's own, at its recompute)."""
    from megatron_zeppelin.spec.memory import plan_memory_balance
    held = res.plans if isinstance(res, _Rounds) else plans
    if len(held) == 1 and not isinstance(res, _Rounds):
        mem = plan_memory_balance(held[0], model, spec.tp, recompute)
    else:
        parts = [plan_memory_balance(p, model, spec.tp, recompute) for p in held]
        by = [max(x["bytes"][r] for x in parts) for r in range(len(parts[0]["bytes"]))]
        mem = dict(bytes=by, max_bytes=max(by), imbalance=max(by) / (sum(by) / len(by)) if sum(by) else 1.0,
                   imbalance_attention=max(x["imbalance_attention"] for x in parts),
                   imbalance_linear=max(x["imbalance_linear"] for x in parts))
    t = [[c.total_s for c in p.cost] for p in plans]
    predicted = sum(max(c.total_s for c in p.cost) for p in held)
    slowest, mean = sum(max(x) for x in t), sum(sum(x) / len(x) for x in t)
    classes: Dict[str, int] = {}
    for p in plans:
        for c, n in p.class_counts().items():
            classes[c] = classes.get(c, 0) + n
    bounds = [p.lower_bound_s if bound_cost is None else lower_bound(p.lengths, bound_cost) for p in plans]
    if spec.pipeline > 1:  # the steps in 1F1B (planner/iteration.py), as the simulator runs them
        from megatron_zeppelin.planner.iteration import pipeline_s
        predicted = pipeline_s([max(c.total_s for c in p.cost) for p in held], spec.pipeline)
        bounds = [pipeline_s(bounds, spec.pipeline)]
    return dict(iteration_s=res.iteration_s, recompute_s=res.recompute_s,
                predicted_s=predicted + res.allreduce_exposed_s,
                lower_bound_s=sum(bounds) + res.allreduce_exposed_s,
                allreduce_s=res.allreduce_exposed_s,
                forward_s=res.forward_s, backward_s=res.backward_s, head_s=res.head_s,
                max_nic_util=res.max_nic_util, nic_bytes=res.link_bytes.get(Link.NIC, 0.0),
                nvlink_bytes=res.link_bytes.get(Link.NVLINK, 0.0), plan_s=plan_s, sim_s=sim_s,
                time_imbalance=slowest / mean if mean > 0 else 1.0,
                memory_imbalance=mem["imbalance"], memory_imbalance_attention=mem["imbalance_attention"],
                memory_imbalance_linear=mem["imbalance_linear"], peak_activation_GB=mem["max_bytes"] / 1e9,
                documents=sum(len(p.lengths) for p in plans), tokens=sum(sum(p.lengths) for p in plans),
                max_length=max(max(p.lengths) for p in plans),
                classes=classes, setting=dict(plans[0].meta).get("cp_size", ""),
                variants=[p.meta.variant for p in plans])


def _simulate_steps(v, steps, plans, topo, profile, model, config, s, tp, options, stages: int = 1,
                    plan_profile=None, beyond: Optional[float] = None):
    """(the micro-batches' plans, the iteration's result): each micro-batch simulated, then
    accumulated as Megatron runs them (sim/iteration.py ``accumulate``: the gradient reduce once,
    after the last; with ``stages`` > 1 ``pipeline``: 1F1B over the stages). dynamic_cp schedules
    the whole global batch at once, as Megatron's scheduler does (``DefaultDynamicCPScheduler.run``
    fetches every micro-batch of the iteration, megatron/core/datasets/data_schedule.py, and packs
    their sequences into as many HDP rounds as it needs): its rounds run one after another, the
    reduce after the very last round. ``beyond``: raise sim/dominated.py ``Beyond`` once the
    iteration so far takes longer: the steps so far (each without its reduce), or in 1F1B the last
    stage's own work so far (its 1/stages of each step's forward and backward, and the head): a
    stage runs its work one piece after another, so no 1F1B schedule is shorter."""
    if v != "dynamic_cp":
        results, so_far = [], 0.0
        for p in plans:  # a step's simulated time so far, t, adds at least t / stages to the last stage
            results.append(simulate(p, profile, model, tp=tp, options=options,
                                    beyond=None if beyond is None else (beyond - so_far) * stages))
            r = results[-1]
            so_far += (r.iteration_s - r.allreduce_exposed_s if stages == 1 else
                       (r.forward_s + r.backward_s) / stages + r.head_s)
            if beyond is not None and so_far > beyond:
                raise Beyond(so_far)
        return plans, (accumulate(results) if stages == 1 else pipeline(results, stages))
    beyond = beyond if stages == 1 else None  # (rounds in 1F1B: run to the end)
    opts = options or SimOptions()
    if len(steps) == 1:
        plan, rr = simulate_rounds(steps[0], topo, profile, model, config, int(s), tp, opts, plan_profile, beyond)
        plans = [plan]
    else:
        plans, rr = _global_batch_rounds(steps, topo, profile, model, config, int(s), tp, opts, plan_profile,
                                         beyond)
    if stages > 1:
        rr.iteration_s = pipeline(rr.results, stages).iteration_s
        rr.allreduce_exposed_s /= stages
    return plans, rr


def _global_batch_rounds(steps, topo, profile, model, config, mslpr: int, tp: int, options: SimOptions,
                         plan_profile=None, beyond: Optional[float] = None):
    """(the rounds' plans, _Rounds) of dynamic_cp over the whole global batch (every micro-batch's
    documents, scheduled together): each round planned and simulated on its own, the capacity that
    of one data-order micro-batch (a rank holds one round at a time)."""
    from megatron_zeppelin.planner import make_context
    from megatron_zeppelin.planner.baselines.dynamic_cp import round_placements
    pooled = [int(L) for lengths in steps for L in lengths]
    ctx = make_context(topo, plan_profile or profile, model, config, total_tokens=max(sum(int(L) for L in x) for x in steps))
    rounds = _Unpredicted(ctx, [([pooled[i] for i in docs], pl) for docs, pl in round_placements(pooled, ctx, mslpr)],
                          beyond)
    rr = _Rounds(rounds.plans(), _rounds_simulated(rounds.plans(), profile, model, tp, options, beyond))
    rr.plans = rounds.predicted()
    return rr.plans, rr


def recompute_rungs(spec: RunSpec) -> List[Tuple[str, int]]:
    """[(recompute, capacity)] a strategy may climb: the run's own when not per strategy, else the
    LADDER's rungs (fastest first) whose capacity holds at least the mean tokens per GPU."""
    if not spec.recompute_per_strategy:
        return [(spec.recompute, spec.capacity)]
    rungs = [(rc, memory_tokens(spec.cluster, spec.model, spec.tp, spec.nodes, 1.0, rc)[1])
             for rc in RECOMPUTE_LADDER]
    return [(rc, cap) for rc, cap in rungs if cap >= spec.tokens_per_gpu]


def _mean_record(recs: List[Dict]) -> Dict:
    out = {f: sum(r[f] for r in recs) / len(recs) for f in _MEAN_FIELDS}
    cls: Dict[str, float] = {}
    for r in recs:
        for c, n in r["classes"].items():
            cls[c] = cls.get(c, 0) + n / len(recs)
    out["classes"] = {c: round(n, 2) for c, n in cls.items()}
    # Which candidate won each plan (Zeppelin's: sim/attribution.py), counted over the run's plans
    out["won"] = count_kinds(v for r in recs for v in r["variants"])
    out["batch_variants"] = [r["variants"] if len(r["variants"]) > 1 else r["variants"][0] for r in recs]
    return out


def run_config(spec: RunSpec, variants: Sequence[str], options: SimOptions = None,
               cp_sizes: Sequence[int] = ()) -> List[Dict]:
    """One record per variant: the spec, the means over the run at the deployed run-level setting
    (``iteration_s``, ...), the oracle's mean (``oracle_iteration_s``), the per-batch times and the
    settings. ``cp_sizes``: the CP sizes fixed-CP baselines may deploy (empty: every power of two).
    With ``spec.recompute_per_strategy`` a setting is (value, recompute) and the record's
    ``recompute`` is the deployed one's."""
    profile, model = without(load_profile(spec.cluster), spec.gpu_term_off), load_model(spec.model)
    # Every strategy plans with the profile it is given (off by spec.profile_error: sim/perturb.py);
    # the simulator times the plans with the true one.
    plan_profile = perturbed(profile, spec.profile_error, spec.profile_seed,
                             only=spec.profile_terms.split("+") if spec.profile_terms else TERMS)
    topo = domain_topology(profile, spec.domain_nodes, spec.tp)
    runs = run_steps(spec, topo.world_size)
    config = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                            gpu_nic_map=topo.gpu_to_nic, cluster=spec.cluster, tp=spec.tp,
                            capacity_tokens=spec.capacity, recompute=spec.recompute,
                            balance_memory=spec.balance_memory)
    rungs = recompute_rungs(spec)
    # Each strategy deploys its own rung, but a configuration has one lower bound: perfect balance at
    # the fastest rung that holds the mean tokens per GPU (a perfectly balanced run fits it), priced
    # with the true profile; the bound at a record's own rung would rise as a slower rung is deployed
    # and flatter the ratio (docs/results.md).
    bound_cost = (cost_model_of(topo, profile, model, config.with_(recompute=rungs[0][0]))
                  if spec.recompute_per_strategy and rungs else None)
    out: List[Optional[Dict]] = [None] * len(variants)
    fastest = None  # (mean time, recompute) the fastest fixed-shape variant deployed (CAPACITY_PLANNED)
    for i in sorted(range(len(variants)), key=lambda i: variants[i] in CAPACITY_PLANNED):  # them first
        v = variants[i]
        climb = (fastest[1],) if v in CAPACITY_PLANNED and fastest is not None else ()
        refused = undeployable(v, spec)  # simulated, kept apart from the deployed (NO_PIPELINE)
        rec = {**asdict(spec), "key": spec.key(), "label": spec.label(), "variant": v, "ranks": topo.world_size,
               "error": "", "oracle_error": ""}
        if spec.profile_error:
            rec["profile_factors"] = factors(spec.profile_error, spec.profile_seed)
        times: Dict = {}
        batch_recs: Dict = {}
        errors: Dict = {}
        fitted = set()  # settings that fit every batch at a faster rung: no slower one for them
        seen = Dominated(len(runs), times)  # fills times; what the settings so far let the next one stop on
        for rc, cap in rungs:
            rc_config = config.with_(recompute=rc, capacity_tokens=cap) if spec.recompute_per_strategy else config
            capacity = cap or 2 * spec.tokens_per_gpu  # the planner's default: twice the mean per rank
            settings = run_settings(v, topo.world_size, capacity, spec.context, cp_sizes,
                                    lambda cp: not a2a_heads_problem(model, config.tp, cp),
                                    lambda cp, a: not a2a_p2p_problem(model, config.tp, topo.gpus_per_node, cp, a))
            for s in settings:
                if s in fitted and rc not in climb:
                    continue
                key = (s, rc) if spec.recompute_per_strategy else s
                times[key], batch_recs[key] = [], []
                for b, steps in enumerate(runs):
                    try:
                        t0 = time.perf_counter()
                        v_steps, v_config = steps, rc_config
                        how = regrouping(v, rc_config)
                        if how is not None and len(steps) > 1:  # the iteration's documents regrouped
                            v_steps, v_config = joint_steps(steps, topo, plan_profile, model, rc_config, how,
                                                             stages=spec.pipeline)
                        plans = ([] if v == "dynamic_cp" else  # dynamic_cp: its rounds (_simulate_steps)
                                 [make_plan(v, lengths, topo, plan_profile, model, v_config, s) for lengths in v_steps])
                        t1 = time.perf_counter()
                        plans, res = _simulate_steps(v, v_steps, plans, topo, profile, model, v_config, s, spec.tp,
                                                     options, spec.pipeline, plan_profile, seen.beyond(key, b))
                        t2 = time.perf_counter()
                    except (ZeppelinError, Beyond) as e:
                        t = DOMINATED if isinstance(e, Beyond) else None
                        seen.done(key, b, t)
                        batch_recs[key].append(None)
                        if t is None:
                            errors.setdefault(key, f"batch {b}: {e}")
                        continue
                    br = _batch_record(plans, res, spec, model, profile, t1 - t0, t2 - t1, rc, bound_cost)
                    seen.done(key, b, br["iteration_s"])
                    batch_recs[key].append(br)
                if all(t is not None for t in times[key]):
                    fitted.add(s)
        dep, dep_times, oracle = deployed_and_oracle(times)
        name = "max_seqlen_per_dp_cp_rank" if v == "dynamic_cp" else "cp_size"
        auto = all((k[0] if spec.recompute_per_strategy else k) == AUTO for k in times)

        def shown(k):  # a setting as the record spells it
            return str(k[0] if spec.recompute_per_strategy else k) + (f" rc={k[1]}" if spec.recompute_per_strategy
                                                                     else "")

        def mean(ts):  # None where a batch does not fit or the setting stopped early (sim/dominated.py)
            return sum(ts) / len(ts) if all(t is not None and t != DOMINATED for t in ts) else None
        if spec.recompute_per_strategy:
            rec["tried"] = {shown(k): mean(ts) for k, ts in times.items()}
        else:
            rec["tried"] = {str(s): mean(ts) for s, ts in times.items()} if not auto else {}
        rec["dominated"] = [shown(k) for k, ts in times.items() if DOMINATED in ts]  # neither deployed nor oracle
        if dep is None:
            why = "; ".join(f"{name} {shown(k)}: {e}" if not auto else
                            (f"rc={k[1]}: {e}" if spec.recompute_per_strategy else e) for k, e in errors.items())
            rec["error"] = (f"no fixed {name} fits every batch of the run: {why}" if not auto else why)
            if not times:
                rec["error"] = f"no recompute of the ladder holds {spec.tokens_per_gpu} tokens per GPU"
        else:
            s_dep = dep[0] if spec.recompute_per_strategy else dep
            if spec.recompute_per_strategy:
                rec["recompute"], rec["capacity"] = dep[1], dict(rungs)[dep[1]]
            rec.update(_mean_record(batch_recs[dep]))
            if spec.recompute_per_strategy and v not in CAPACITY_PLANNED and not refused and (
                    fastest is None or rec["iteration_s"] < fastest[0]):
                fastest = (rec["iteration_s"], dep[1])
            rec["batch_iteration_s"] = dep_times
            rec["run_setting"] = "" if s_dep == AUTO else str(s_dep)
            rec["cp_size"] = str(s_dep) if v in CP_VARIANTS else batch_recs[dep][0]["setting"]
        if not oracle or any(s is None for s in oracle):
            b = oracle.index(None) if oracle else 0
            rec["oracle_error"] = f"batch {b} fits no setting"
        else:
            rec["oracle_iteration_s"] = sum(times[s][b] for b, s in enumerate(oracle)) / len(oracle)
            rec["oracle_settings"] = ([shown(s) if s[0] != AUTO else f"rc={s[1]}" for s in oracle]
                                      if spec.recompute_per_strategy else
                                      [str(s) if s != AUTO else "" for s in oracle])
        rec["run_setting_name"] = name if not auto else ""
        if refused and not rec["error"]:  # its times kept apart, as what it would take
            rec["error"] = f"not deployable with pipeline stages: {refused}"
            rec["hypothetical_iteration_s"] = rec.pop("iteration_s")
            rec.pop("oracle_iteration_s", None)
        out[i] = rec
    return out


def undeployable(variant: str, spec: RunSpec) -> str:
    """Why ``variant`` cannot be deployed in ``spec``'s run ('' where it can): ``NO_PIPELINE``.

    >>> undeployable("dynamic_cp", RunSpec("pipeline", "h200", "llama3-70b", 8, "github", 65536, 16, 16384, pipeline=2))[:40]
    "Megatron-LM's hybrid context parallelism"
    >>> undeployable("dynamic_cp", RunSpec("pipeline", "h200", "llama3-70b", 8, "github", 65536, 16, 16384, pipeline=1))
    ''
    """
    return NO_PIPELINE.get(variant, "") if spec.pipeline > 1 else ""
