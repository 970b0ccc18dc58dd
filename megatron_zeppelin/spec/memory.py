"""Predicted memory per GPU: weights, gradients, optimizer states (by ZeRO stage and TP) and
activations (by the planned per-rank token capacity).

Bytes per parameter (mixed precision, Adam, as Megatron and DeepSpeed count them): weights
``param_bytes`` (2 for bf16; 4 for fp32 as the CPU runs), gradients ``grad_bytes``, optimizer states
4 (fp32 master copy, only when weights are not fp32) + 8 (Adam m, v). ZeRO-1 divides the optimizer
states by DP, ZeRO-2 also the gradients, ZeRO-3 also the weights; TP divides all of them.

Activations saved for the backward, per token per layer, in elements of the activation dtype
(LLaMA layer, flash/fused attention so no L x L scores; sequence parallel with TP so /TP):
``9h + 3kv + heads + 4ffn`` -- norm input and output (2h), QKV output (h + 2kv), rotary q, k
(h + kv), attention output (h) and its log-sum-exp (heads), out-projection output (h), pre-MLP
norm input and output (2h), fc1 output (2 ffn), the SwiGLU product and its SiLU (2 ffn), fc2
output (h). Plus the head: final norm (2h) and, in fp32, the logits, their softmax and gradient
(3 vocab / TP). ``tokens`` is the most tokens any rank holds (the plan's per-rank capacity).

>>> from megatron_zeppelin.spec.model import ModelSpec
>>> tiny = ModelSpec(name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, dtype_bytes=4)
>>> activation_bytes_per_token(tiny)   # 2 x (9*64 + 3*32 + 4 + 4*128) x 4 + 2*64*4 + 3*256*4
13088
>>> m = predict_memory(tiny, tokens=1000, dp=2, zero_stage=3, param_bytes=4, grad_bytes=4)
>>> m.weights == tiny.params() * 4 // 2, m.optimizer == tiny.params() * 8 // 2
(True, True)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.model import ModelSpec
from megatron_zeppelin.spec.recompute import LADDER, Recompute


class MemoryModelError(ZeppelinError):
    pass


HEADROOM = 0.90  # fraction of GPU memory the prediction may use (allocator, workspaces, NCCL buffers)


# The recompute concept (levels, Megatron's flags) lives in megatron_zeppelin/spec/recompute.py; this
# module says what each level keeps in memory.
RECOMPUTE_LADDER = LADDER


def layer_parts_per_token(m: ModelSpec, recompute=None) -> tuple:
    """Elements one layer saves per token for the backward, split by layout and by where they live
    under TP: ((attention replicated, attention sharded), (linear replicated, linear sharded)).
    Replicated without sequence parallelism (sharded /TP with it): input norm in/out (2h) and the
    out-projection output (h) on the attention side, pre-MLP norm in/out (2h) and the fc2 output
    (h) on the linear side. Always sharded /TP (inside the TP region): QKV output (h + 2kv), rotary
    q, k (h + kv), core attention output (h) and its log-sum-exp (heads); fc1 output, SwiGLU product
    and SiLU (4 ffn). Selective recompute drops what its modules recompute: core_attn the attention
    output and LSE (q, k, v stay: they are its inputs), mlp the 4 ffn inside the MLP, layernorm the
    two norm outputs."""
    rc = Recompute.parse(recompute)
    kv = m.kv_heads * m.head_dim
    a_rep, a_sh = 3 * m.hidden, 3 * m.hidden + 3 * kv + m.heads
    l_rep, l_sh = 3 * m.hidden, 4 * m.ffn
    if rc.granularity == "selective":
        if rc.has("core_attn"):
            a_sh -= m.hidden + m.heads
        if rc.has("mlp"):
            l_sh -= 4 * m.ffn
        if rc.has("layernorm"):
            a_rep -= m.hidden
            l_rep -= m.hidden
    return (a_rep, a_sh), (l_rep, l_sh)


def head_bytes_per_token(m: ModelSpec, tp: int = 1, sp: bool = True) -> int:
    """Final norm (sharded with sequence parallelism) and the logits path in fp32 (3 vocab / TP)."""
    return int(2 * m.hidden * m.dtype_bytes // (tp if sp else 1) + 3 * m.vocab * 4 // tp)


def sp_rows(tokens, tp: int):
    """Rows of a layout of ``tokens`` tokens under sequence parallelism: a multiple of TP, at least
    one per TP rank (the pad rows the batch adds; integration/batch.py pads them). The one rule:
    the cost model's ``layout_rows`` calls it. Works on arrays.

    >>> sp_rows(0, 2), sp_rows(5, 2), sp_rows(5, 1), sp_rows(np.array([0, 3]), 2).tolist()
    (2, 6, 5, [2, 4])
    """
    if tp <= 1:
        return tokens
    t = np.maximum(-(-np.asarray(tokens, dtype=np.int64) // tp) * tp, tp)
    return int(t) if t.ndim == 0 else t


def activation_bytes(m: ModelSpec, att_tokens: int, lin_tokens: int, tp: int = 1, recompute=None,
                     sp: bool = True) -> int:
    """Peak activation bytes of a rank holding ``att_tokens`` in the attention layout and
    ``lin_tokens`` in the linear layout (the head runs on the linear layout), with TP ``tp`` and
    sequence parallelism ``sp`` (Megatron's --sequence-parallel; without it the replicated parts are
    whole on every TP rank; a plan's pad rows: ``plan_memory_balance``). Full recompute keeps each
    layer's input (h, attention layout) plus one layer's saved tensors while it is recomputed; block
    recompute ("full:block=N") that for its first N layers, everything for the others.

    >>> from megatron_zeppelin.spec.model import ModelSpec
    >>> tiny = ModelSpec(name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, dtype_bytes=4)
    >>> activation_bytes(tiny, 1000, 1000, tp=2) < activation_bytes(tiny, 1000, 1000, tp=2, sp=False)
    True
    >>> [activation_bytes(tiny, 1000, 1000, recompute=r) for r in ("full", "full:block=1", "full:block=2", "none")]
    [8848000, 8592000, 8848000, 13088000]
    """
    rep_div = tp if sp else 1
    db = m.dtype_bytes

    def one(rc) -> int:  # what one layer saves, recomputing ``rc``
        (a_rep, a_sh), (l_rep, l_sh) = layer_parts_per_token(m, rc)
        if sp:  # everything /TP
            return ((a_rep + a_sh) * att_tokens + (l_rep + l_sh) * lin_tokens) * db // tp
        return (a_rep * att_tokens + l_rep * lin_tokens) * db + (a_sh * att_tokens + l_sh * lin_tokens) * db // tp

    groups = Recompute.parse(recompute).groups(m.layers)  # with block: the full layers, then the rest
    recomputed = sum(n for n, rc in groups if rc.full)
    kept = sum(n * one(rc) for n, rc in groups if not rc.full)
    # A recomputed layer keeps its input; while it is recomputed its tensors exist, and the kept
    # layers' are freed by then (their backward came first): the peak is the larger of the two.
    layers = recomputed * m.hidden * att_tokens * db // rep_div + max(kept, one("none") if recomputed else 0)
    return int(layers + head_bytes_per_token(m, tp, sp) * lin_tokens)


def activation_bytes_per_token(m: ModelSpec, tp: int = 1, recompute=False, sp: bool = True) -> int:
    """Bytes per token when both layouts hold the same tokens. ``recompute``: a Recompute, its string,
    or True for Megatron's full recompute (only each layer's input is kept, plus one layer's saved
    tensors while that layer is recomputed)."""
    return activation_bytes(m, 1, 1, tp, recompute, sp)


def plan_memory_balance(plan, model: ModelSpec, tp: int = 1, recompute=None, sequence_parallel: bool = True) -> dict:
    """Per-rank peak activation memory of a Plan (attention and linear layouts, with ``recompute``;
    with TP and ``sequence_parallel`` each layout's pad rows, ``sp_rows``, count too):
    ``bytes`` per rank, ``max_bytes``, ``imbalance`` = max / mean, and the same ratio of each
    layout's token counts (``imbalance_attention``, ``imbalance_linear``). Memory is what DistCA
    (arXiv 2510.18121) names as the weak side of per-document planning; a ratio of 1 is even."""
    world = len(plan.attention_layout)
    pad = pad_rows(plan)  # a CP baseline's pad rows (TE / Megatron) are held too; they do not remap
    att = [sum(s.stop - s.start for s in plan.attention_layout[r]) + pad[r] for r in range(world)]
    lin = [sum(s.stop - s.start for s in plan.linear_layout[r]) + pad[r] for r in range(world)]
    rows = (lambda n: sp_rows(n, tp)) if sequence_parallel else (lambda n: n)  # SP's pad rows are held too
    gathered = gathered_kv_bytes(plan, model, tp)
    by = [activation_bytes(model, rows(a), rows(b), tp, recompute, sequence_parallel) + g
          for a, b, g in zip(att, lin, gathered)]

    def ratio(xs):
        mean = sum(xs) / len(xs)
        return max(xs) / mean if mean > 0 else 1.0

    return {"bytes": by, "max_bytes": max(by), "imbalance": ratio(by), "imbalance_attention": ratio(att),
            "imbalance_linear": ratio(lin)}


def pad_rows(plan) -> list:
    """Per rank, the pad rows its padded documents add (``DocPlan.padded``: TE's THD CP pads each
    document to a multiple of 2 x cp, Megatron's dynamic CP to 2 x DP x CP; planner/build/padding.py):
    each of a document's G members holds padded / G rows, the real ones among them.

    >>> from megatron_zeppelin.planner.baselines.static_cp import cp_placement
    >>> from megatron_zeppelin.planner.build.assemble import assemble
    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> ctx = toy_context(gpus=2)
    >>> plan = assemble("static_cp", [13, 6], ctx, cp_placement([13, 6], ctx, 2, "p2p"))   # as 16 and 8
    >>> [plan.tokens(r) for r in range(2)], pad_rows(plan)
    ([10, 9], [2, 3])
    """
    out = [0] * len(plan.attention_layout)
    for d in plan.docs:
        if d.padded:
            ranks = (d.owner,) if d.ring < 0 else plan.rings[d.ring].ranks
            for i, r in enumerate(ranks):
                out[r] += d.padded // len(ranks) - sum(s.stop - s.start for s in d.member_segments(i))
    return out


# Transformer Engine's all-gather CP (AttnFuncWithCPAndKVAllGather, Llama 3's design) saves only the
# rank's own K/V, but each layer's backward holds the whole group's gathered K and V and the
# whole-length dK and dV before their reduce-scatter (TE d0067d0, pytorch/attention/
# dot_product_attention/context_parallel.py:3768-3788; the forward's gather, :3217-3218, holds two)
GATHERED_KV_BUFFERS = 4


def gathered_kv_bytes(plan, model, tp: int = 1) -> list:
    """Per rank, the transient bytes all-gather CP adds to its activation peak: GATHERED_KV_BUFFERS x
    the whole (padded) sequence of its group's documents x the K/V heads of its TP rank. One layer's
    at a time (freed before the next), so once, not per layer; 0 for other rings.

    >>> from megatron_zeppelin.planner import plan_batch
    >>> from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE
    >>> from megatron_zeppelin.spec.config import ZeppelinConfig
    >>> from megatron_zeppelin.spec.topology import Topology
    >>> cfg = ZeppelinConfig(gpus_per_node=2, cp_size=2, capacity_tokens=64)
    >>> p = plan_batch([16, 8], Topology(1, 2), TOY_PROFILE, TOY_MODEL, cfg, strategy="allgather_cp")
    >>> gathered_kv_bytes(p, TOY_MODEL)   # 4 x 24 tokens x 2 K/V heads x 16 dims x 2 bytes
    [6144, 6144]
    """
    out = [0] * len(plan.attention_layout)
    per_row = GATHERED_KV_BUFFERS * model.kv_bytes_per_token(tp) // 2  # kv_bytes_per_token counts K and V
    for ring in plan.rings:
        if ring.comm == "allgather":
            whole = sum(plan.docs[d].padded or plan.docs[d].length for d in ring.docs)
            for r in ring.ranks:
                out[r] += whole * per_row
    return out


@dataclass(frozen=True)
class MemoryPrediction:
    weights: int
    gradients: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations

    def to_dict(self) -> dict:
        return dict(asdict(self), total=self.total)

    def describe(self, unit: float = 2**30, name: str = "GiB") -> str:
        return (f"{self.total / unit:.1f} {name} = weights {self.weights / unit:.1f} + grads "
                f"{self.gradients / unit:.1f} + optimizer {self.optimizer / unit:.1f} + activations "
                f"{self.activations / unit:.1f}")


def predict_memory(m: ModelSpec, tokens: int, dp: int = 1, tp: int = 1, zero_stage: int = 0,
                   param_bytes: int = 2, grad_bytes: int = 4, recompute=False) -> MemoryPrediction:
    """Bytes on one GPU for ``tokens`` tokens held at once by that rank."""
    if zero_stage not in (0, 1, 2, 3):
        raise MemoryModelError(f"ZeRO stage must be 0..3, got {zero_stage} (set --zero-stage)")
    if dp < 1 or tp < 1:
        raise MemoryModelError(f"dp and tp must be >= 1, got dp={dp} tp={tp}")
    p = m.params() / tp
    opt_per_param = 8 + (0 if param_bytes >= 4 else 4)  # Adam m, v (+ fp32 master weights)
    weights = p * param_bytes / (dp if zero_stage >= 3 else 1)
    grads = p * grad_bytes / (dp if zero_stage >= 2 else 1)
    opt = p * opt_per_param / (dp if zero_stage >= 1 else 1)
    act = activation_bytes_per_token(m, tp, recompute) * tokens
    return MemoryPrediction(int(weights), int(grads), int(opt), int(act))


def plan_capacity_tokens(plan) -> int:
    """The most tokens any rank holds in either layout of a Plan (activations scale with it)."""
    world = len(plan.attention_layout)
    att = max(plan.tokens(r) for r in range(world))
    lin = max(sum(s.stop - s.start for s in plan.linear_layout[r]) for r in range(world))
    return int(max(att, lin))


def capacity_tokens(m: ModelSpec, gpu_memory_bytes: float, dp: int = 1, tp: int = 1, zero_stage: int = 1,
                    recompute=False, headroom: float = HEADROOM) -> int:
    """The most tokens one rank can hold at once: what ``headroom`` of the GPU's memory leaves for
    activations after weights, gradients and optimizer states (Megatron's distributed optimizer is
    ZeRO-1). 0 when even the states do not fit.

    >>> from megatron_zeppelin.spec.model import ModelSpec
    >>> tiny = ModelSpec(name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, dtype_bytes=4)
    >>> states = predict_memory(tiny, tokens=0).total
    >>> capacity_tokens(tiny, (states + 13088 * 1000) / 0.9)   # room for 1000 tokens of 13088 bytes
    1000
    """
    states = predict_memory(m, 0, dp=dp, tp=tp, zero_stage=zero_stage, recompute=recompute).total
    room = headroom * gpu_memory_bytes - states
    return max(0, int(room // activation_bytes_per_token(m, tp, recompute)))
