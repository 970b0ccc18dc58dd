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

A *variant* is a strategy, or one of the paper's ablation steps expressed as a Plan:

- ``static_cp+routing``: TE-style CP with the routing layer on (routing only);
- ``zeppelin-noremap``: Zeppelin's partitioning and engine without the remapping layer;
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
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from megatron_zeppelin.spec.config import STRATEGIES, ZeppelinConfig
from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.hardware import HardwareProfile, load_profile
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.sim.iteration import SimOptions, simulate
from megatron_zeppelin.spec.words import Link

ABLATIONS = ("static_cp+routing", "zeppelin-noremap")
VARIANTS = STRATEGIES + ABLATIONS
CP_VARIANTS = ("static_cp", "allgather_cp", "static_cp+routing")
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

    def key(self) -> str:
        regime = "/memory" if self.regime == "memory" else ""
        balanced = "/balance-memory" if self.balance_memory else ""
        return (f"{self.study}/{self.cluster}/{self.model}-tp{self.tp}/{self.dataset}/ctx{self.context // 1024}K/"
                f"{self.nodes}n{regime}{balanced}/seed{self.seed}")

    def label(self) -> str:
        """Short, distinguishable label for plots and tables."""
        tp = f" tp{self.tp}" if self.tp > 1 else ""
        regime = " mem" if self.regime == "memory" else f" {self.tokens_per_gpu // 1024}K/GPU"
        return f"{self.cluster} {self.model}{tp} {self.dataset} {self.context // 1024}K {self.nodes}n{regime}"


def domain_topology(profile: HardwareProfile, nodes: int, tp: int = 1) -> Topology:
    g = profile.gpus_per_node
    if tp < 1 or g % tp:
        raise ZeppelinError(f"tensor-parallel size {tp} does not divide the {g} GPUs of a {profile.name} node "
                            "(set tp in the matrix or --tp to a divisor)")
    gpus = g // tp
    nics = max(1, min(gpus, profile.nics_per_node // tp))
    wiring = profile.gpu_to_nic if tp == 1 and nics == profile.nics_per_node else ()
    return Topology(nodes, gpus, nics, wiring)


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
        config = config.with_(cp_size=int(setting))
    if variant == "dynamic_cp" and setting is not None:
        from megatron_zeppelin.planner.baselines.dynamic_cp import dynamic_cp_placement
        ctx = make_context(topo, profile, model, config, total_tokens=sum(lengths))
        return assemble(variant, list(lengths), ctx, dynamic_cp_placement(list(lengths), ctx, int(setting)))
    if variant in STRATEGIES:
        return plan_batch(lengths, topo, profile, model, config, strategy=variant)
    if variant == "zeppelin-noremap":
        return plan_batch(lengths, topo, profile, model, config.with_(remap=False), strategy="zeppelin")
    if variant == "static_cp+routing":  # static_cp's candidates with routing on, picked as every strategy's
        ctx = make_context(topo, profile, model, config, total_tokens=sum(lengths))

        def routed(lengths, ctx, search):
            for c in plan_static_cp(lengths, ctx, search):
                if c.placement is not None:
                    c.placement.routing = topo.nodes > 1
                yield c
        return choose(variant, list(lengths), ctx, routed)[0]
    raise ZeppelinError(f"unknown variant '{variant}' (strategies in the matrix must be among {', '.join(VARIANTS)})")


def run_settings(variant: str, world: int, capacity: int, context: int, cp_sizes: Sequence[int]) -> List:
    """The run-level values a user could deploy for ``variant``: CP sizes dividing the domain for the
    fixed-CP baselines (``cp_sizes``, or every power of two and the whole domain); dynamic_cp's
    max_seqlen_per_dp_cp_rank from the per-rank capacity down by halves while the largest
    power-of-two group still holds a context-long document; [AUTO] for variants without one."""
    from megatron_zeppelin.planner.baselines.cp_groups import cp_sizes as all_cp
    if variant in CP_VARIANTS:
        return [cp for cp in (cp_sizes or all_cp(world)) if cp >= 1 and world % cp == 0]
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


def simulate_rounds(lengths, topo, profile, model, config, mslpr: int, tp: int, options: SimOptions = None):
    """(the merged plan, _Rounds) of dynamic_cp run as Megatron runs it: each HDP round planned
    and simulated on its own (no DP all-reduce but after the last), times summed."""
    from dataclasses import replace as dc_replace

    from megatron_zeppelin.planner import make_context
    from megatron_zeppelin.planner.build.assemble import assemble
    from megatron_zeppelin.planner.baselines.dynamic_cp import dynamic_cp_placement, round_placements
    ctx = make_context(topo, profile, model, config, total_tokens=sum(lengths))
    merged = assemble("dynamic_cp", list(lengths), ctx, dynamic_cp_placement(list(lengths), ctx, mslpr))
    rounds = round_placements(list(lengths), ctx, mslpr)
    opts = options or SimOptions()
    plans, results = [], []
    for k, (docs, pl) in enumerate(rounds):
        plan = assemble("dynamic_cp", [int(lengths[i]) for i in docs], ctx, pl)
        o = opts if k == len(rounds) - 1 else dc_replace(opts, allreduce=False)
        plans.append(plan)
        results.append(simulate(plan, profile, model, tp=tp, options=o))
    rr = _Rounds(plans, results)
    # The prediction of the rounds run one after another (each from a barrier), for the record.
    merged_rounds = dc_replace(merged, cost=tuple(_sum_costs([p.cost for p in plans])))
    return merged_rounds, rr


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


def _batch_record(plan, res, spec, model, profile, plan_s, sim_s) -> Dict:
    """A batch's plan and simulated iteration (the run's activation recompute is in both: the plan
    is priced with it, the simulator runs the recomputed forward in each layer's backward;
    ``recompute_s`` is the busiest rank's recomputed work) and the plan's time and memory balance."""
    from megatron_zeppelin.spec.memory import plan_memory_balance
    mem = plan_memory_balance(plan, model, spec.tp, spec.recompute)
    if isinstance(res, _Rounds):  # a rank holds one round's activations at a time
        parts = [plan_memory_balance(p, model, spec.tp, spec.recompute) for p in res.plans]
        by = [max(x["bytes"][r] for x in parts) for r in range(len(mem["bytes"]))]
        mem = dict(mem, bytes=by, max_bytes=max(by), imbalance=max(by) / (sum(by) / len(by)) if sum(by) else 1.0,
                   imbalance_attention=max(x["imbalance_attention"] for x in parts),
                   imbalance_linear=max(x["imbalance_linear"] for x in parts))
    t = [c.total_s for c in plan.cost]
    predicted = max(t) if not isinstance(res, _Rounds) else sum(max(c.total_s for c in p.cost) for p in res.plans)
    return dict(iteration_s=res.iteration_s, recompute_s=res.recompute_s,
                predicted_s=predicted + res.allreduce_exposed_s,
                lower_bound_s=plan.lower_bound_s + res.allreduce_exposed_s, allreduce_s=res.allreduce_exposed_s,
                forward_s=res.forward_s, backward_s=res.backward_s, head_s=res.head_s,
                max_nic_util=res.max_nic_util, nic_bytes=res.link_bytes.get(Link.NIC, 0.0),
                nvlink_bytes=res.link_bytes.get(Link.NVLINK, 0.0), plan_s=plan_s, sim_s=sim_s,
                time_imbalance=max(t) / (sum(t) / len(t)) if sum(t) > 0 else 1.0,
                memory_imbalance=mem["imbalance"], memory_imbalance_attention=mem["imbalance_attention"],
                memory_imbalance_linear=mem["imbalance_linear"], peak_activation_GB=mem["max_bytes"] / 1e9,
                documents=len(plan.lengths), tokens=sum(plan.lengths), max_length=max(plan.lengths),
                classes=plan.class_counts(), setting=dict(plan.meta).get("cp_size", ""))


def _mean_record(recs: List[Dict]) -> Dict:
    out = {f: sum(r[f] for r in recs) / len(recs) for f in _MEAN_FIELDS}
    cls: Dict[str, float] = {}
    for r in recs:
        for c, n in r["classes"].items():
            cls[c] = cls.get(c, 0) + n / len(recs)
    out["classes"] = {c: round(n, 2) for c, n in cls.items()}
    return out


def run_config(spec: RunSpec, variants: Sequence[str], options: SimOptions = None,
               cp_sizes: Sequence[int] = ()) -> List[Dict]:
    """One record per variant: the spec, the means over the run at the deployed run-level setting
    (``iteration_s``, ...), the oracle's mean (``oracle_iteration_s``), the per-batch times and the
    settings. ``cp_sizes``: the CP sizes fixed-CP baselines may deploy (empty: every power of two)."""
    profile, model = load_profile(spec.cluster), load_model(spec.model)
    topo = domain_topology(profile, spec.nodes, spec.tp)
    runs = run_lengths(spec, topo.world_size)
    config = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                            gpu_nic_map=topo.gpu_to_nic, cluster=spec.cluster, tp=spec.tp,
                            capacity_tokens=spec.capacity, recompute=spec.recompute,
                            balance_memory=spec.balance_memory)
    capacity = spec.capacity or 2 * spec.tokens_per_gpu  # the planner's default: twice the mean per rank
    out = []
    for v in variants:
        rec = {**asdict(spec), "key": spec.key(), "label": spec.label(), "variant": v, "ranks": topo.world_size,
               "error": "", "oracle_error": ""}
        settings = run_settings(v, topo.world_size, capacity, spec.context, cp_sizes)
        times: Dict = {}
        batch_recs: Dict = {}
        errors: Dict = {}
        for s in settings:
            times[s], batch_recs[s] = [], []
            for b, lengths in enumerate(runs):
                try:
                    t0 = time.perf_counter()
                    plan = make_plan(v, lengths, topo, profile, model, config, s)
                    t1 = time.perf_counter()
                    if v == "dynamic_cp":  # Megatron's execution: its rounds one after another
                        plan, res = simulate_rounds(lengths, topo, profile, model, config, int(s), spec.tp, options)
                    else:
                        res = simulate(plan, profile, model, tp=spec.tp, options=options)
                    t2 = time.perf_counter()
                except ZeppelinError as e:
                    times[s].append(None)
                    batch_recs[s].append(None)
                    errors.setdefault(s, f"batch {b}: {e}")
                    continue
                br = _batch_record(plan, res, spec, model, profile, t1 - t0, t2 - t1)
                times[s].append(br["iteration_s"])
                batch_recs[s].append(br)
        dep, dep_times, oracle = deployed_and_oracle(times)
        name = "max_seqlen_per_dp_cp_rank" if v == "dynamic_cp" else "cp_size"
        rec["tried"] = {str(s): (sum(ts) / len(ts) if all(t is not None for t in ts) else None)
                        for s, ts in times.items()} if settings != [AUTO] else {}
        if dep is None:
            why = "; ".join(f"{name} {s}: {e}" if s != AUTO else e for s, e in errors.items())
            rec["error"] = (f"no fixed {name} fits every batch of the run: {why}" if settings != [AUTO] else why)
        else:
            rec.update(_mean_record(batch_recs[dep]))
            rec["batch_iteration_s"] = dep_times
            rec["run_setting"] = "" if dep == AUTO else str(dep)
            rec["cp_size"] = str(dep) if v in CP_VARIANTS else batch_recs[dep][0]["setting"]
        if any(s is None for s in oracle):
            b = oracle.index(None)
            rec["oracle_error"] = f"batch {b} fits no setting"
        else:
            rec["oracle_iteration_s"] = sum(times[s][b] for b, s in enumerate(oracle)) / len(oracle)
            rec["oracle_settings"] = [str(s) if s != AUTO else "" for s in oracle]
        rec["run_setting_name"] = name if settings != [AUTO] else ""
        out.append(rec)
    return out
