"""``zeppelin advise``: the Megatron configuration to train a model on a cluster at a fixed global
batch: TP (with sequence parallelism), CP size or Zeppelin, micro-batch size and gradient
accumulation, DDP / distributed optimizer / Megatron-FSDP (ZeRO-0..3), activation recompute.

The global batch (tokens) and the context (the longest document, ``--seq-length`` as the user
gives it) are hyperparameters: advise never changes them. With TP, CP and ``W`` GPUs the
data-parallel size is ``DP = W / (TP x CP)``. What each rank holds in one micro-batch is the free
choice, searched per strategy:

- stock Megatron (packed DP, CP): ``--seq-length`` is the context ``C``; the global batch is ``G / C``
  sequences, and each micro-batch size ``mbs`` (``DP x mbs`` dividing them) fixes the accumulation
  ``ga = G / (C x DP x mbs)``; Megatron CP searches its CP sizes;
- the Zeppelin entry (Zeppelin, and packed DP with documents kept whole): ``--seq-length`` is each
  rank's *share* ``S`` and ``--max-position-embeddings`` the longest document ``C``; a global
  micro-batch is ``S x mbs x DP`` tokens of whole documents (one may span ranks), so the shares
  ``C, C/2, ... C/16`` (at least ``MIN_SHARE``) are searched as CP sizes are, with
  ``ga = G / (S x mbs x DP)``: at ``G`` = 1M on 32 ranks, a 64K context is a share of 8K x 4 steps,
  the activations per rank of CP 8. A global micro-batch must hold the context (the entry cuts a
  document at its end): ``S x mbs x DP >= C``. Packed DP below the context runs through the Zeppelin entry
  (``--zeppelin-strategy packed_dp``), since stock Megatron would cut documents at ``--seq-length``.

For each (TP, strategy, CP or share, mbs) advise plans one global micro-batch
of the sampled documents (plan_batch), predicts its forward+backward with the simulator (sim/:
attention, linear, ring and remap work; ``--no-sim``: the planner's prediction) and multiplies by
``ga``; then, per ZeRO stage and recompute level, it adds the data-parallel communication the
backward and forward do not hide (ring model of sim/allreduce.py, fp32 gradients, bf16 params):

- ZeRO-0 (DDP, ``--overlap-grad-reduce``): one all-reduce per step, overlapped with the last
  micro-batch's backward (one bucket per layer);
- ZeRO-1 (``--use-distributed-optimizer --overlap-param-gather``): a reduce-scatter per step
  overlapped like DDP's, then an all-gather of bf16 parameters hidden behind the next forward;
- ZeRO-2 (Megatron-FSDP ``optim_grads``): gradients are not kept whole, so a reduce-scatter per
  *micro-batch*, each overlapped with that micro-batch's backward, plus ZeRO-1's all-gather;
- ZeRO-3 (Megatron-FSDP ``optim_grads_params``): per *micro-batch* an all-gather of the
  parameters in the forward and again in the backward plus the reduce-scatter, prefetched one
  layer ahead (what the forward/backward cannot hide is exposed, and the first layer's gather).

Memory per GPU: weights, gradients, optimizer states sharded over the ``W / TP`` data-parallel x
context-parallel ranks (spec/memory.py), ZeRO-3's two gathered layers, and the activations of the
fullest rank of one micro-batch by recompute level (spec/memory.py; the levels: spec/recompute.py ADVISE_LEVELS).
Runs through the Zeppelin entry are weighed with DDP and the distributed optimizer only
(spec/megatron_flags.py ``ZEPPELIN_ZERO_STAGES``: Megatron-FSDP with Zeppelin has run nowhere). The pick: the fastest that
fits in 90% of the GPU memory; within 3% of the fastest the simplest: no recompute before
selective before full, the distributed optimizer before DDP (it moves 6 instead of 8 bytes per
parameter and shards the optimizer states) before ZeRO-2/3, smaller TP, smaller CP, packed DP
before Zeppelin before CP, stock Megatron before the Zeppelin entry, larger micro-batches and shares.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import List, Optional, Sequence

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.megatron_flags import ZEPPELIN_ZERO_STAGES
from megatron_zeppelin.spec.memory import HEADROOM, MemoryPrediction, activation_bytes_per_token, predict_memory
from megatron_zeppelin.spec.recompute import ADVISE_LEVELS, Recompute
from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.model import ModelSpec
from megatron_zeppelin.spec.hardware import HardwareProfile
from megatron_zeppelin.spec.topology import Topology

NEAR = 1.03  # candidates within 3% of the fastest count as equally fast
STRATEGY_ORDER = ("packed_dp", "zeppelin", "static_cp", "hybrid_dp")
ZERO_ORDER = (1, 0, 2, 3)
ZEPPELIN_ENTRY_STRATEGIES = ("zeppelin", "hybrid_dp")  # always through the Zeppelin entry (packed_dp below the context too)
MICRO_BATCH_SIZES = (1, 2, 4, 8)
SHARE_STEPS = 4  # the Zeppelin entry's shares: the context / 2^k for k = 0 .. SHARE_STEPS
MIN_SHARE = 1024  # smaller per-rank shares leave the GPU idle between kernels
SAMPLED_STEPS = 3  # micro-batches planned besides the longest document's, for the step's mean time  # the distributed optimizer first: no slower than DDP, less memory
DP_VARIANT = {0: "megatron-core DDP, --overlap-grad-reduce (bucketed all-reduce during the backward)",
              1: "ZeRO-1: megatron-core distributed optimizer (--use-distributed-optimizer)",
              2: "ZeRO-2: Megatron-FSDP, gradients and optimizer states sharded (optim_grads)",
              3: "ZeRO-3: Megatron-FSDP, parameters too (optim_grads_params)"}



def time_factor(m: ModelSpec, level: Recompute) -> float:
    """Multiplier on a micro-batch's forward+backward time (forward ~ 1/3 of it): full re-runs every
    layer's forward (4/3); the MLP's selective recompute re-runs the MLP, at most its share of the
    linear FLOPs. (advise's coarse estimate; simulated runs time recompute in the layer program.)"""
    if level.full:
        return 4.0 / 3.0
    if level.has("mlp"):
        h, d = m.hidden, m.head_dim
        attn = h * m.heads * d * 2 + 2 * h * m.kv_heads * d
        mlp = 3 * h * m.ffn
        return 1.0 + mlp / (attn + mlp) / 3.0
    return 1.0

class AdviseError(ZeppelinError):
    pass


@dataclass
class Candidate:
    tp: int
    cp: int
    strategy: str
    zero_stage: int
    recompute: Recompute
    mbs: int
    ga: int
    dp: int
    iteration_s: float
    tokens_per_s: float
    capacity_tokens: int  # the fullest rank's tokens in one micro-batch
    memory: MemoryPrediction
    fits: bool
    compute_s: float = 0.0  # ga micro-batches' forward+backward (with recompute)
    comm_exposed_s: float = 0.0  # data-parallel communication not hidden
    classes: dict = field(default_factory=dict)
    share: int = 0  # the line's --seq-length (0: the context): through the Zeppelin entry, each rank's share
    zeppelin_entry: bool = False  # whole documents planned per global micro-batch (--zeppelin-balance)

    def __post_init__(self):
        self.zeppelin_entry = self.zeppelin_entry or self.strategy in ZEPPELIN_ENTRY_STRATEGIES

    @property
    def sp(self) -> bool:
        """Megatron sequence parallelism with TP (every strategy, Zeppelin included)."""
        return self.tp > 1

    def key(self):
        return (ADVISE_LEVELS.index(self.recompute), ZERO_ORDER.index(self.zero_stage), self.tp, self.cp,
                STRATEGY_ORDER.index(self.strategy) if self.strategy in STRATEGY_ORDER else 9, self.zeppelin_entry,
                -self.mbs, -self.share)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["memory"], d["recompute"] = self.memory.to_dict(), self.recompute.granularity
        return d


@dataclass
class Advice:
    best: Optional[Candidate]
    candidates: List[Candidate]
    reasons: List[str]

    def to_dict(self) -> dict:
        return {"best": self.best.to_dict() if self.best else None, "reasons": self.reasons,
                "candidates": [c.to_dict() for c in self.candidates]}


def split_micro_batches(lengths: Sequence[int], ga: int) -> List[List[int]]:
    """Documents in sampled order into ``ga`` micro-batches of about equal tokens.

    >>> split_micro_batches([4, 4, 2, 2, 4, 4], 2)
    [[4, 4, 2], [2, 4, 4]]
    """
    total = sum(int(x) for x in lengths)
    out, cur, acc = [], [], 0
    for x in lengths:
        cur.append(int(x))
        acc += int(x)
        if len(out) < ga - 1 and acc >= total * (len(out) + 1) / ga:
            out.append(cur)
            cur = []
    if cur or len(out) < ga:
        out.append(cur)
    return out


def _ring_s(nbytes: float, topo: Topology, profile: HardwareProfile) -> float:
    from megatron_zeppelin.sim.allreduce import allreduce_s
    gb = 1e9
    return allreduce_s(nbytes, topo, profile.nvlink_GBps * gb, profile.nic_GBps * gb,
                       profile.nvlink_latency_us * 1e-6, profile.nic_latency_us * 1e-6)


def _layer_ends(fwd: float, bwd: float, layers: int) -> List[float]:
    return [fwd + (i + 1) * bwd / layers for i in range(layers)]


def comm_exposed_s(stage: int, ga: int, fwd_s: float, bwd_s: float, layers: int, ar_grad_s: float,
                   ar_param_s: float) -> float:
    """DP communication per step not hidden by compute (see the module doc). ``ar_grad_s``: an
    all-reduce of the fp32 gradients; ``ar_param_s``: of the bf16 parameters (a reduce-scatter or
    all-gather moves half an all-reduce).

    >>> comm_exposed_s(0, 4, fwd_s=1.0, bwd_s=2.0, layers=2, ar_grad_s=4.0, ar_param_s=2.0)   # AR 4 s, bwd hides ~1
    3.0
    >>> comm_exposed_s(3, 4, 1.0, 2.0, 2, 4.0, 2.0) > comm_exposed_s(2, 4, 1.0, 2.0, 2, 4.0, 2.0)
    True
    """
    from megatron_zeppelin.sim.allreduce import exposed_s
    ends = _layer_ends(fwd_s, bwd_s, layers)
    end = fwd_s + bwd_s
    rs, ag = ar_grad_s / 2, ar_param_s / 2
    if stage == 0:
        return exposed_s(ar_grad_s, ends, end, True)
    gather = max(0.0, ag - fwd_s)  # the next step's forward hides the parameter all-gather
    if stage == 1:
        return exposed_s(rs, ends, end, True) + gather
    if stage == 2:
        return ga * exposed_s(rs, ends, end, True) + gather
    per_mb = max(0.0, ag - fwd_s) + max(0.0, ag + rs - bwd_s) + ag / layers
    return ga * per_mb


def _micro_batch(lengths, topo, profile, model, tp, strategy, cp, use_sim):
    """(forward s, backward s, fullest rank's tokens, classes) of one planned global micro-batch."""
    from megatron_zeppelin.spec.memory import plan_capacity_tokens
    from megatron_zeppelin.planner import plan_batch

    # static_cp in TE's p2p mode: the mode the advice's Megatron line renders (--cp-comm-type p2p)
    cfg = ZeppelinConfig(strategy=strategy, gpus_per_node=topo.gpus_per_node, tp=tp,
                         cp_size=cp if strategy == "static_cp" else 0, cp_comm="p2p" if strategy == "static_cp" else None)
    plan = plan_batch(list(lengths), topo, profile, model, cfg)
    if use_sim:
        from megatron_zeppelin.sim.iteration import SimOptions, simulate
        r = simulate(plan, profile, model, tp=tp, options=SimOptions(allreduce=False))
        fwd, bwd = r.forward_s + r.head_s / 3, r.backward_s + 2 * r.head_s / 3
    else:
        fwd, bwd = plan.predicted_iteration_s / 3, 2 * plan.predicted_iteration_s / 3
    return fwd, bwd, plan_capacity_tokens(plan), plan.class_counts()


def _step(lengths, ga, topo, profile, model, tp, strategy, cp, use_sim):
    """(forward s, backward s, fullest rank's tokens, classes) of one micro-batch, for ``ga`` of them:
    the micro-batch holding the longest document (where the fullest rank is, and often the slowest
    step at a small share: a ring) planned, and up to ``SAMPLED_STEPS`` others, evenly spaced, for the
    other ga - 1 steps' mean; memory is the fullest rank of any planned micro-batch, classes the
    longest document's micro-batch's."""
    batches = split_micro_batches(lengths, ga)
    longest = max(range(len(batches)), key=lambda i: max(batches[i], default=0))
    big = _micro_batch(batches[longest], topo, profile, model, tp, strategy, cp, use_sim)
    rest = [i for i in range(len(batches)) if i != longest and batches[i]]
    if not rest:
        return big
    picks = sorted({rest[k * (len(rest) - 1) // max(1, SAMPLED_STEPS - 1)] for k in range(min(SAMPLED_STEPS, len(rest)))})
    others = [_micro_batch(batches[i], topo, profile, model, tp, strategy, cp, use_sim) for i in picks]
    n = len(batches) - 1
    fwd = (big[0] + n * sum(o[0] for o in others) / len(others)) / len(batches)
    bwd = (big[1] + n * sum(o[1] for o in others) / len(others)) / len(batches)
    return fwd, bwd, max([big[2]] + [o[2] for o in others]), big[3]


def _layer_params(m: ModelSpec) -> int:
    h, d = m.hidden, m.head_dim
    return h * m.heads * d * 2 + 2 * h * m.kv_heads * d + 3 * h * m.ffn + 2 * h


def shapes(strategy: str, domain: int, context: int, total: int, mbs_choices=MICRO_BATCH_SIZES,
           share_steps: int = SHARE_STEPS):
    """(CP, --seq-length, micro-batch size, through the Zeppelin entry) of every layout advise weighs
    for ``strategy`` on ``domain`` ranks (per TP group), a global batch of ``total`` tokens and the
    context ``context`` (module doc); Megatron's rule: --global-batch-size (sequences) divides by
    micro-batch x DP. With one micro-batch size given, the shares use it; else a share below the
    context takes micro-batch 1 (a share S at micro-batch 2 is the share 2S). Through the Zeppelin
    entry a global micro-batch (share x micro-batch x DP tokens) must hold the context: the entry
    cuts the last document of each to fit (integration/data.py BatchSampler).

    >>> [s for s in shapes("zeppelin", 32, 65536, 2**20)]   # 1M tokens of a 64K context on 32 ranks
    [(1, 32768, 1, True), (1, 16384, 1, True), (1, 8192, 1, True), (1, 4096, 1, True)]
    >>> [s for s in shapes("static_cp", 32, 65536, 2**20) if s[0] == 8]   # CP 8: DP 4 x mbs divides 16
    [(8, 65536, 1, False), (8, 65536, 2, False), (8, 65536, 4, False)]
    """
    from megatron_zeppelin.planner.baselines.cp_groups import cp_sizes

    out = []

    def add(cp, seq, mbs, entry):
        # the Zeppelin entry cuts a document at the end of its global micro-batch: one must hold the context
        whole = not entry or seq * mbs * (domain // cp) >= context
        if whole and total % seq == 0 and (total // seq) % (domain // cp * mbs) == 0:
            out.append((cp, seq, mbs, entry))

    if strategy == "static_cp":
        for cp in (c for c in cp_sizes(domain) if c > 1 and context % (2 * c) == 0):  # Megatron: seq % 2CP
            for mbs in mbs_choices:
                add(cp, context, mbs, False)
        return out
    entry = strategy in ZEPPELIN_ENTRY_STRATEGIES
    for mbs in mbs_choices:
        add(1, context, mbs, entry)
    if strategy in ("packed_dp",) + ZEPPELIN_ENTRY_STRATEGIES:
        shares = [context >> k for k in range(1, share_steps + 1) if (context >> k) >= MIN_SHARE
                  and (context >> k) << k == context]
        for share in shares:
            for mbs in (mbs_choices if len(mbs_choices) == 1 else (1,)):
                add(1, share, mbs, True)
    return out


def advise(lengths, model: ModelSpec, profile: HardwareProfile, nodes: int, gpu_memory_bytes: float,
           seq_length: int, strategies=("packed_dp", "zeppelin", "static_cp"), tps=None,
           use_sim: bool = True, max_mbs: int = 8, micro_batch_sizes=None, share_steps: int = SHARE_STEPS) -> Advice:
    """The pick for a global batch of ``lengths`` (cut at the context ``seq_length``) and every
    candidate weighed; ``share_steps`` 0 keeps every run's --seq-length at the context (no shares)."""
    from megatron_zeppelin.planner import PlanError

    gpn = profile.gpus_per_node
    world = nodes * gpn
    total = int(sum(int(x) for x in lengths))
    if seq_length < 1 or total % seq_length:
        raise AdviseError(f"the global batch ({total} tokens) must be a whole number of --seq-length "
                          f"{seq_length} sequences (Megatron's --global-batch-size counts sequences)")
    if max(int(x) for x in lengths) > seq_length:
        raise AdviseError(f"documents longer than --seq-length {seq_length}: cut them (--context-length)")
    gbs = total // seq_length
    tps = tps or [t for t in (1, 2, 4, 8) if t <= gpn and gpn % t == 0 and model.heads % t == 0
                  and model.kv_heads % t == 0]
    cands: List[Candidate] = []
    for tp in tps:
        topo = Topology(nodes, gpn // tp, max(1, profile.nics_per_node // tp))
        domain = topo.world_size
        ar_grad = _ring_s(model.params() / tp * 4, topo, profile)
        ar_param = _ring_s(model.params() / tp * 2, topo, profile)
        mbs_choices = tuple(micro_batch_sizes or (m for m in MICRO_BATCH_SIZES if m <= max_mbs))
        for strategy in strategies:
            for cp, seq, mbs, entry in shapes(strategy, domain, seq_length, total, mbs_choices, share_steps):
                dp = domain // cp
                ga = total // (seq * dp * mbs)
                try:
                    fwd, bwd, cap, classes = _step(lengths, ga, topo, profile, model, tp, strategy, cp, use_sim)
                except (PlanError, ZeppelinError):
                    continue  # e.g. a document longer than this layout holds
                for level in ADVISE_LEVELS:
                    f = time_factor(model, level)
                    compute = ga * (fwd + bwd) * f
                    for stage in (ZEPPELIN_ZERO_STAGES if entry else (0, 1, 2, 3)):
                        comm = comm_exposed_s(stage, ga, fwd, bwd * f, model.layers, ar_grad, ar_param)
                        t = compute + comm
                        states = predict_memory(model, 0, dp=domain, tp=tp, zero_stage=stage)
                        gathered = 2 * 2 * _layer_params(model) // tp if stage == 3 else 0
                        sp = tp > 1
                        act = activation_bytes_per_token(model, tp, level, sp) * cap
                        mem = MemoryPrediction(states.weights + gathered, states.gradients, states.optimizer,
                                               int(act))
                        cands.append(Candidate(tp, cp, strategy, stage, level, mbs, ga, dp, t, total / t, cap,
                                               mem, mem.total <= HEADROOM * gpu_memory_bytes, compute, comm,
                                               classes, seq, entry))
    if not cands:
        raise AdviseError(f"no (TP, CP or per-rank share, micro-batch size) divides the global batch of {gbs} "
                          f"sequences of {seq_length} tokens over {world} GPUs: change --global-batch-tokens, "
                          "--seq-length, --micro-batch-size or --nodes")
    return pick(cands, gpu_memory_bytes)


def pick(cands: List[Candidate], gpu_memory_bytes: float) -> Advice:
    """The Advice among ``cands`` (the rule of the module doc), with its reasons."""
    fit = [c for c in cands if c.fits]
    if not fit:
        small = min(cands, key=lambda c: c.memory.total)
        return Advice(None, cands, [
            f"nothing fits in {gpu_memory_bytes / 2**30:.0f} GiB x {HEADROOM:.0%}: the smallest candidate "
            f"(TP {small.tp}, CP {small.cp}, ZeRO-{small.zero_stage}, {small.recompute.granularity} recompute, "
            f"micro-batch {small.mbs}) needs {small.memory.describe()}; add --nodes or use pipeline parallelism"])
    fastest = min(c.iteration_s for c in fit)
    best = min((c for c in fit if c.iteration_s <= fastest * NEAR), key=lambda c: c.key())
    from megatron_zeppelin.advise.reasons import reasons
    return Advice(best, cands, reasons(best, cands, gpu_memory_bytes))


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
