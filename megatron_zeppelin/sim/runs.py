"""One benchmark configuration: sample a batch, plan it with each variant, simulate each plan.

A *variant* is a strategy at its best setting (the baselines pick their CP size themselves when
``cp_size`` is 0), or one of the paper's ablation steps expressed as a Plan:

- ``static_cp+routing``: TE-style CP with the routing layer on (routing only);
- ``zeppelin-noremap``: Zeppelin's partitioning and engine without the remapping layer;
- ``zeppelin``: everything.

Tensor parallelism: the domain is one TP slice, so a node holds gpus_per_node / tp of its ranks and
(as the slices share the node's NICs evenly) nics_per_node / tp NICs at full bandwidth.

>>> from megatron_zeppelin.profile import load_profile
>>> domain_topology(load_profile("a800"), nodes=2, tp=2).describe()
'2 node(s) x 4 GPU(s), 2 NIC(s)/node, gpu->nic [0, 0, 1, 1]'
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Sequence

from ..config import STRATEGIES, ZeppelinConfig
from ..errors import ZeppelinError
from ..model_spec import load_model
from ..profile import HardwareProfile, load_profile
from ..topology import Topology
from .iteration import SimOptions, simulate

ABLATIONS = ("static_cp+routing", "zeppelin-noremap")
VARIANTS = STRATEGIES + ABLATIONS


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

    def key(self) -> str:
        return (f"{self.study}/{self.cluster}/{self.model}-tp{self.tp}/{self.dataset}/ctx{self.context // 1024}K/"
                f"{self.nodes}n/seed{self.seed}")


def domain_topology(profile: HardwareProfile, nodes: int, tp: int = 1) -> Topology:
    g = profile.gpus_per_node
    if tp < 1 or g % tp:
        raise ZeppelinError(f"tensor-parallel size {tp} does not divide the {g} GPUs of a {profile.name} node "
                            "(set tp in the matrix or --tp to a divisor)")
    gpus = g // tp
    nics = max(1, min(gpus, profile.nics_per_node // tp))
    wiring = profile.gpu_to_nic if tp == 1 and nics == profile.nics_per_node else ()
    return Topology(nodes, gpus, nics, wiring)


def make_plan(variant: str, lengths: Sequence[int], topo: Topology, profile, model, config: ZeppelinConfig):
    from ..planner import make_context, plan_batch
    from ..planner.assemble import assemble
    from ..planner.strategies import get_strategy
    if variant in STRATEGIES:
        return plan_batch(lengths, topo, profile, model, config, strategy=variant)
    if variant == "zeppelin-noremap":
        return plan_batch(lengths, topo, profile, model, config.with_(remap=False), strategy="zeppelin")
    if variant == "static_cp+routing":
        ctx = make_context(topo, profile, model, config, total_tokens=sum(lengths))
        placement = get_strategy("static_cp")(list(lengths), ctx)
        placement.routing = topo.nodes > 1
        return assemble(variant, list(lengths), ctx, placement)
    raise ZeppelinError(f"unknown variant '{variant}' (strategies in the matrix must be among {', '.join(VARIANTS)})")


CP_VARIANTS = ("static_cp", "allgather_cp", "static_cp+routing")


def _best_cp(v, lengths, topo, profile, model, config, spec, options, cp_sizes):
    """A fixed-CP baseline at its best CP size by simulation: each size of ``cp_sizes`` that divides
    the domain is planned and simulated; the fastest is kept. Returns (plan, result, {cp: seconds})."""
    best, tried = None, {}
    for cp in cp_sizes:
        if cp < 1 or topo.world_size % cp:
            continue
        try:
            plan = make_plan(v, lengths, topo, profile, model, config.with_(cp_size=cp))
        except ZeppelinError:
            continue  # e.g. over the token capacity at this CP size
        res = simulate(plan, profile, model, tp=spec.tp, options=options)
        tried[cp] = res.iteration_s
        if best is None or res.iteration_s < best[1].iteration_s:
            best = (plan, res)
    if best is None:
        raise ZeppelinError(f"{v}: no CP size of {list(cp_sizes)} fits the batch (capacity) on {topo.world_size} ranks")
    return best[0], best[1], tried


def run_config(spec: RunSpec, variants: Sequence[str], options: SimOptions = None,
               cp_sizes: Sequence[int] = ()) -> List[Dict]:
    """One record per variant: the spec, the plan's prediction and the simulated iteration.
    ``cp_sizes``: fixed-CP baselines try each and keep the fastest simulated; empty = the baseline
    picks its CP size itself (by the planner's prediction)."""
    from ..workloads import sample_batch
    profile, model = load_profile(spec.cluster), load_model(spec.model)
    topo = domain_topology(profile, spec.nodes, spec.tp)
    lengths = [int(x) for x in sample_batch(spec.dataset, spec.tokens_per_gpu * topo.world_size, spec.seed,
                                            max_len=spec.context)]
    config = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                            gpu_nic_map=topo.gpu_to_nic, cluster=spec.cluster, tp=spec.tp,
                            capacity_tokens=spec.capacity)
    out = []
    for v in variants:
        rec = {**asdict(spec), "key": spec.key(), "variant": v, "ranks": topo.world_size,
               "documents": len(lengths), "tokens": sum(lengths), "max_length": max(lengths)}
        try:
            t0 = time.perf_counter()
            tried = {}
            if cp_sizes and v in CP_VARIANTS:
                plan, res, tried = _best_cp(v, lengths, topo, profile, model, config, spec, options, cp_sizes)
                t1 = t2 = time.perf_counter()
            else:
                plan = make_plan(v, lengths, topo, profile, model, config)
                t1 = time.perf_counter()
                res = simulate(plan, profile, model, tp=spec.tp, options=options)
                t2 = time.perf_counter()
        except ZeppelinError as e:
            rec["error"] = str(e)
            out.append(rec)
            continue
        meta = dict(plan.meta)
        rec.update(iteration_s=res.iteration_s, predicted_s=plan.predicted_iteration_s + res.allreduce_exposed_s,
                   lower_bound_s=plan.lower_bound_s + res.allreduce_exposed_s, allreduce_s=res.allreduce_exposed_s,
                   forward_s=res.forward_s, backward_s=res.backward_s, head_s=res.head_s,
                   max_nic_util=res.max_nic_util, nic_bytes=res.link_bytes.get("nic", 0.0),
                   nvlink_bytes=res.link_bytes.get("nvlink", 0.0), cp_size=meta.get("cp_size", ""),
                   classes=plan.class_counts(), plan_s=t1 - t0, sim_s=t2 - t1, error="",
                   cp_tried={str(k): x for k, x in tried.items()})
        out.append(rec)
    return out
