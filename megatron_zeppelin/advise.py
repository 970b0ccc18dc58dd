"""``zeppelin advise``: which data-parallel variant, ZeRO stage, TP size and sequence strategy
(Zeppelin, packed DP, or a CP baseline) to use for a model, cluster, node count and dataset.

For every TP size (dividing the heads and the GPUs per node) and strategy it plans one sampled
global batch (plan_batch), predicts the iteration time with the simulator (sim/: the plan's
attention, linear, ring and remap work plus the DP gradient all-reduce, overlapped with the
backward as --overlap-grad-reduce), and for every ZeRO stage the memory per GPU (dp/memory.py; the
activations from the plan's largest per-rank token count). ZeRO-3 adds one parameter all-gather
per step (1.5x the DP traffic), counted as exposed. The pick: the fastest candidate that fits in
90% of the GPU memory; within 3% of the fastest, the simpler (lower ZeRO stage, smaller TP,
packed DP before Zeppelin before CP).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import List, Optional

from .config import ZeppelinConfig
from .dp.memory import HEADROOM, MemoryPrediction, plan_capacity_tokens, predict_memory
from .errors import ZeppelinError
from .model_spec import ModelSpec
from .profile import HardwareProfile
from .topology import Topology

RECOMPUTE_COST = 4 / 3  # full activation recompute: one extra forward per fwd+bwd (~3 forwards)
NEAR = 1.03  # candidates within 3% of the fastest count as equally fast
STRATEGY_ORDER = ("packed_dp", "zeppelin", "hybrid_dp", "static_cp", "dynamic_cp", "allgather_cp")
DP_VARIANT = {0: "megatron-core DDP with --overlap-grad-reduce (bucketed all-reduce during backward)",
              1: "ZeRO-1: megatron-core distributed optimizer (--use-distributed-optimizer)",
              2: "ZeRO-2: gradients and optimizer states sharded (FSDP2 reshard_after_forward=False / "
                 "Megatron-FSDP optim_grads)",
              3: "ZeRO-3: parameters too (FSDP2 fully_shard / Megatron-FSDP optim_grads_params)"}


class AdviseError(ZeppelinError):
    pass


@dataclass
class Candidate:
    tp: int
    zero_stage: int
    strategy: str
    iteration_s: float
    tokens_per_s: float
    capacity_tokens: int
    memory: MemoryPrediction
    fits: bool
    recompute: bool = False
    classes: dict = field(default_factory=dict)

    def key(self):
        return (self.recompute, self.zero_stage, self.tp, STRATEGY_ORDER.index(self.strategy) if self.strategy in STRATEGY_ORDER else 9)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["memory"] = self.memory.to_dict()
        return d


@dataclass
class Advice:
    best: Optional[Candidate]
    candidates: List[Candidate]
    reasons: List[str]

    def to_dict(self) -> dict:
        return {"best": self.best.to_dict() if self.best else None, "reasons": self.reasons,
                "candidates": [c.to_dict() for c in self.candidates]}


def _iteration_s(plan, profile, model, tp: int, use_sim: bool) -> float:
    if use_sim:
        try:
            from .sim.iteration import SimOptions, simulate
            return simulate(plan, profile, model, tp=tp, options=SimOptions(overlap_grad_reduce=True)).iteration_s
        except ImportError:
            pass
    return plan.predicted_iteration_s


def _zero3_extra_s(model: ModelSpec, topo: Topology, profile: HardwareProfile, tp: int) -> float:
    from .sim.allreduce import allreduce_s
    gb = 1e9
    full = allreduce_s(model.params() / tp * 2, topo, profile.nvlink_GBps * gb, profile.nic_GBps * gb,
                       profile.nvlink_latency_us * 1e-6, profile.nic_latency_us * 1e-6)
    return 0.5 * full  # one more all-gather of the bf16 weights = half an all-reduce


def advise(lengths, model: ModelSpec, profile: HardwareProfile, nodes: int, gpu_memory_bytes: float,
           strategies=("packed_dp", "zeppelin", "static_cp", "hybrid_dp"), tps=None, use_sim: bool = True) -> Advice:
    from .planner import PlanError, plan_batch

    gpn = profile.gpus_per_node
    tps = tps or [t for t in (1, 2, 4, 8) if t <= gpn and gpn % t == 0 and model.heads % t == 0
                  and model.kv_heads % t == 0]
    total = int(sum(int(x) for x in lengths))
    cands: List[Candidate] = []
    for tp in tps:
        topo = Topology(nodes, gpn // tp, max(1, profile.nics_per_node // tp))
        dp = topo.world_size
        for strategy in strategies:
            cfg = ZeppelinConfig(strategy=strategy, gpus_per_node=topo.gpus_per_node, tp=tp)
            try:
                plan = plan_batch(list(lengths), topo, profile, model, cfg)
            except (PlanError, ZeppelinError):
                continue  # e.g. a document longer than the domain holds with this strategy
            base = _iteration_s(plan, profile, model, tp, use_sim)
            cap = plan_capacity_tokens(plan)
            for recompute in (False, True):
                for stage in (0, 1, 2, 3):
                    # full recompute runs every layer's forward twice: fwd+bwd ~ 3 forwards -> 4
                    t = base * (RECOMPUTE_COST if recompute else 1.0)
                    t += _zero3_extra_s(model, topo, profile, tp) if stage == 3 else 0.0
                    mem = predict_memory(model, cap, dp=dp, tp=tp, zero_stage=stage, recompute=recompute)
                    cands.append(Candidate(tp, stage, strategy, t, total / t, cap, mem,
                                           mem.total <= HEADROOM * gpu_memory_bytes, recompute, plan.class_counts()))
    if not cands:
        raise AdviseError("no strategy could plan this batch: lower --context-length or add --nodes")
    fit = [c for c in cands if c.fits]
    if not fit:
        small = min(cands, key=lambda c: c.memory.total)
        return Advice(None, cands, [
            f"nothing fits in {gpu_memory_bytes / 2**30:.0f} GiB x {HEADROOM:.0%}: the smallest candidate "
            f"(TP {small.tp}, ZeRO-{small.zero_stage}, {small.strategy}) needs {small.memory.describe()}; "
            "add --nodes, lower --global-batch-tokens / --context-length, or use pipeline parallelism"])
    fastest = min(c.iteration_s for c in fit)
    near = [c for c in fit if c.iteration_s <= fastest * NEAR]
    best = min(near, key=lambda c: c.key())
    return Advice(best, cands, _reasons(best, cands, gpu_memory_bytes))


def _reasons(best: Candidate, cands: List[Candidate], mem_bytes: float) -> List[str]:
    G = 2**30
    out = [("full activation recompute (--recompute-granularity full): without it the activations do not fit"
            if best.recompute else "no activation recompute needed") + ";",
           f"memory per GPU {best.memory.describe()} of {mem_bytes / G:.0f} GiB "
           f"(activations for {best.capacity_tokens} tokens, the plan's fullest rank)."]
    lower = [c for c in cands if c.tp == best.tp and c.strategy == best.strategy and c.zero_stage < best.zero_stage
             and c.recompute == best.recompute]
    if lower:
        c = max(lower, key=lambda c: c.zero_stage)
        out.append(f"ZeRO-{best.zero_stage}: ZeRO-{c.zero_stage} would need {c.memory.total / G:.1f} GiB "
                   "(does not fit)" if not c.fits else f"ZeRO-{best.zero_stage}: faster than ZeRO-{c.zero_stage}.")
    else:
        out.append(f"ZeRO-{best.zero_stage}: the model states fit; sharding more only adds communication"
                   + (" (ZeRO-1 costs no extra traffic, so DDP or ZeRO-1 are equivalent here)." if best.zero_stage == 0 else "."))
    smaller_tp = [c for c in cands if c.tp < best.tp and c.fits]
    out.append(f"TP {best.tp}: " + ("the smallest TP that fits and is fast." if not smaller_tp else
                                    "faster than the smaller TP sizes that fit."))
    same = {c.strategy: c for c in cands if c.tp == best.tp and c.zero_stage == best.zero_stage
            and c.recompute == best.recompute}
    comp = ", ".join(f"{s} {c.iteration_s * 1e3:.0f} ms{'' if c.fits else ' (no fit)'}" for s, c in same.items())
    if best.strategy == "packed_dp":
        out.append(f"packed DP without CP: every document fits on one GPU and balancing gains under "
                   f"{(NEAR - 1):.0%} (predicted {comp}).")
    elif best.strategy == "zeppelin":
        out.append(f"Zeppelin (--zeppelin-balance): {best.classes} documents local/intra/inter; it beats "
                   f"the alternatives on this long-tailed batch (predicted {comp}).")
    else:
        out.append(f"{best.strategy}: predicted {comp}.")
    return out


def parse_memory(text: str) -> float:
    """'141GB' / '80GiB' / '141' (GB) -> bytes.

    >>> parse_memory("141GB"), parse_memory("80GiB") == 80 * 2**30, parse_memory("16")
    (141000000000.0, True, 16000000000.0)
    """
    s = str(text).strip().lower()
    for suf, mult in (("gib", 2**30), ("gb", 1e9), ("g", 1e9)):
        if s.endswith(suf):
            s, m = s[:-len(suf)], mult
            break
    else:
        m = 1e9
    try:
        v = float(s) * m
    except ValueError:
        raise AdviseError(f"--gpu-memory '{text}' is not a size (e.g. 80GB, 141GB, 96GiB)") from None
    if v <= 0:
        raise AdviseError(f"--gpu-memory must be > 0, got '{text}'")
    return v
