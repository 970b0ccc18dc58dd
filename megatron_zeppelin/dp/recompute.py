"""Activation memory per token by Megatron recompute level and sequence parallelism, and what each
level costs in time: what ``zeppelin advise`` weighs. (dp/memory.py holds the no-recompute / full
formula; this module adds selective recompute and TP without sequence parallelism, and should be
unified with memory.py's recompute levels.)

Saved per token per layer (elements of the activation dtype; LLaMA layer, flash attention), split
by where it lives under TP:

- replicated without SP (sharded /TP with ``--sequence-parallel``): input norm in and out (2h),
  attention out-projection output (h), pre-MLP norm in and out (2h), MLP output (h) = ``6h``;
- always sharded /TP (inside the TP region): QKV output (h + 2kv), rotary q, k (h + kv), core
  attention output (h) and its log-sum-exp (heads), MLP fc1 output (2 ffn), SwiGLU product and
  SiLU (2 ffn) = ``3h + 3kv + heads + 4ffn``.

Levels (Megatron flags):

- ``none``;
- ``selective``: ``--recompute-granularity selective --recompute-modules mlp``: the dense MLP is
  re-run in the backward, so its internals (4 ffn) are not kept; costs one more MLP forward;
- ``full``: ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1``:
  only each layer's input (h) is kept, plus one layer's saved tensors during its recompute; costs
  one more forward of every layer.

The head (final norm 2h and the fp32 logits path 3 vocab / TP) is kept at every level.

>>> from megatron_zeppelin.model_spec import ModelSpec
>>> tiny = ModelSpec(name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, dtype_bytes=4)
>>> from megatron_zeppelin.dp.memory import activation_bytes_per_token
>>> act_bytes_per_token(tiny, 1, Recompute.NONE) == activation_bytes_per_token(tiny)
True
>>> act_bytes_per_token(tiny, 1, Recompute.FULL) == activation_bytes_per_token(tiny, recompute=True)
True
>>> act_bytes_per_token(tiny, 1, Recompute.SELECTIVE) < act_bytes_per_token(tiny, 1, Recompute.NONE)
True
"""

from __future__ import annotations

import enum

from ..model_spec import ModelSpec


class Recompute(str, enum.Enum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"

    def megatron_flags(self, layers: int):
        if self is Recompute.SELECTIVE:
            return ["--recompute-granularity", "selective", "--recompute-modules", "mlp"]
        if self is Recompute.FULL:  # megatron-core requires the method and the layer count with "full"
            return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
        return []


def _layer_parts(m: ModelSpec):
    kv = m.kv_heads * m.head_dim
    replicated = 6 * m.hidden
    sharded = 3 * m.hidden + 3 * kv + m.heads + 4 * m.ffn
    return replicated, sharded


def act_bytes_per_token(m: ModelSpec, tp: int = 1, level: Recompute = Recompute.NONE, sp: bool = True) -> int:
    """Bytes one rank keeps per token it holds (tokens are this rank's sequence share)."""
    rep, sh = _layer_parts(m)
    rep_div = tp if sp else 1
    if level is Recompute.FULL:
        one_layer = rep // rep_div + sh // tp
        layers = (m.layers * m.hidden // rep_div + one_layer) * m.dtype_bytes
    else:
        if level is Recompute.SELECTIVE:
            sh -= 4 * m.ffn
        layers = m.layers * (rep * m.dtype_bytes // rep_div + sh * m.dtype_bytes // tp)
    head = 2 * m.hidden * m.dtype_bytes // rep_div + 3 * m.vocab * 4 // tp
    return int(layers + head)


def time_factor(m: ModelSpec, level: Recompute) -> float:
    """Multiplier on a micro-batch's forward+backward time (forward ~ 1/3 of it): full re-runs every
    layer's forward (4/3); selective re-runs the MLP, at most its share of the linear FLOPs."""
    if level is Recompute.FULL:
        return 4.0 / 3.0
    if level is Recompute.SELECTIVE:
        h, d = m.hidden, m.head_dim
        attn = h * m.heads * d * 2 + 2 * h * m.kv_heads * d
        mlp = 3 * h * m.ffn
        return 1.0 + mlp / (attn + mlp) / 3.0
    return 1.0
