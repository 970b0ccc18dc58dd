"""``te``: Transformer Engine's fused attention (cuDNN) on THD with cu_seqlens and softmax statistics.

What Megatron users run with ``--transformer-impl transformer_engine``. Written against Transformer
Engine 2.20.0.dev0 (github.com/NVIDIA/TransformerEngine, commit d0067d0d,
``transformer_engine/pytorch/cpp_extensions/fused_attn.py``), the functions TE's own context-parallel
ring calls (``attention/dot_product_attention/context_parallel.py``):

    fused_attn_fwd(is_training, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q, k, v,
        fake_dtype, fused_attention_backend, attn_bias=None, cu_seqlens_q_padded=None,
        cu_seqlens_kv_padded=None, ..., attn_scale=None, dropout=0.0, fast_zero_fill=True,
        qkv_layout="sbh3d", o_format="sbhd", ..., attn_bias_type="no_bias", attn_mask_type="padding",
        softmax_type="vanilla", window_size=(-1, -1), ...) -> (out, aux_ctx_tensors)
    fused_attn_bwd(max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q, k, v, o, d_o,
        fake_dtype, aux_ctx_tensors, fused_attention_backend, cu_seqlens_q_padded=None,
        cu_seqlens_kv_padded=None, ..., attn_scale=None, dropout=0.0, fast_zero_fill=True,
        qkv_layout="sbh3d", o_format="sbhd", do_format="sbhd", dqkv_layout="sbh3d", ...,
        attn_mask_type="padding", ..., window_size=(-1, -1), ..., deterministic=False, ...)
        -> (dq, dk, dv, ...)

Layout ``thd_thd_thd`` (q ``[total_q, heads, d]``, k/v ``[total_k, kv_heads, d]``: GQA native), masks
``padding`` (full) and ``padding_causal_bottom_right`` with window ``(-1, 0)`` (TE's
check_set_window_size), sub-backend ``F16_arbitrary_seqlen`` (fp16/bf16). ``aux_ctx_tensors`` is
``[softmax_stats, rng_state]``; softmax_stats is the LSE, ``[total_q, heads, 1]`` with cuDNN >= 9.6
on compute capability != 12.0, else ``[batch, heads, max_seqlen_q, 1]`` (TE's
``softmax_lse_in_packed_format``); the backward takes it back in the same layout, and the rng state
is unused without dropout. ``o_format``/``do_format``/``dqkv_layout`` are passed only where the
installed TE has them (older TE infers them from qkv_layout).
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import torch

from megatron_zeppelin.attention.kernels.varlen import KernelError, Varlen

LAYOUT = "thd_thd_thd"
_NEWER = {"o_format": "thd", "do_format": "thd", "dqkv_layout": LAYOUT}


def load():
    """TE's fused-attention functions and the facts that fix the LSE layout, or a KernelError."""
    try:
        from transformer_engine.pytorch.cpp_extensions import fused_attn as fa
        from transformer_engine.pytorch.utils import get_cudnn_version, get_device_compute_capability
    except ImportError as e:
        raise KernelError(f"the te attention kernel needs Transformer Engine ({e}): install it or use "
                          "--transformer-impl local / another --zeppelin-attention-kernel") from e
    return SimpleNamespace(fused_attn_fwd=fa.fused_attn_fwd, fused_attn_bwd=fa.fused_attn_bwd,
                           FusedAttnBackend=fa.FusedAttnBackend, get_cudnn_version=get_cudnn_version,
                           get_device_compute_capability=get_device_compute_capability)


def packed_stats(te) -> bool:
    return tuple(te.get_cudnn_version()) >= (9, 6, 0) and tuple(te.get_device_compute_capability()) != (12, 0)


def _mask(spec: Varlen):
    return ("padding_causal_bottom_right", (-1, 0)) if spec.causal else ("padding", (-1, -1))


def _newer(fn, names):
    params = inspect.signature(fn).parameters
    return {n: _NEWER[n] for n in names if n in params}


def _token_index(spec: Varlen, device):
    lens = torch.tensor(spec.seqlens_q, device=device)
    b = torch.repeat_interleave(torch.arange(len(spec.seqlens_q), device=device), lens)
    starts = torch.tensor(spec.cu_q[:-1], device=device)
    return b, torch.arange(spec.total_q, device=device) - starts[b]


def stats_to_lse(stats: torch.Tensor, spec: Varlen) -> torch.Tensor:
    """TE softmax_stats -> lse [total_q, heads] (either layout)."""
    if stats.dim() == 3:  # [t, h, 1]
        return stats[..., 0]
    b, pos = _token_index(spec, stats.device)  # [b, h, max_q, 1] -> rows of each sequence
    return stats[b, :, pos, 0]


def lse_to_stats(lse: torch.Tensor, spec: Varlen, packed: bool) -> torch.Tensor:
    lse = lse.float()
    if packed:
        return lse.unsqueeze(-1).contiguous()
    stats = lse.new_zeros((len(spec.seqlens_q), lse.shape[1], spec.max_q, 1))
    b, pos = _token_index(spec, lse.device)
    stats[b, :, pos, 0] = lse
    return stats


def forward(q, k, v, spec: Varlen, scale: float, te=None):
    te = te if te is not None else load()
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise KernelError(f"the te attention kernel runs fp16/bf16, not {q.dtype}: train with --bf16 or --fp16")
    cu_q, cu_k = spec.cu_seqlens(q.device)
    mask, window = _mask(spec)
    out, aux = te.fused_attn_fwd(
        True, spec.max_q, spec.max_k, cu_q, cu_k, q.contiguous(), k.contiguous(), v.contiguous(), q.dtype,
        te.FusedAttnBackend["F16_arbitrary_seqlen"], cu_seqlens_q_padded=cu_q, cu_seqlens_kv_padded=cu_k,
        attn_scale=scale, dropout=0.0, qkv_layout=LAYOUT, attn_bias_type="no_bias", attn_mask_type=mask,
        window_size=window, **_newer(te.fused_attn_fwd, ("o_format",)))[:2]
    return out, stats_to_lse(aux[0], spec)


def backward(dout, q, k, v, out, lse, spec: Varlen, scale: float, te=None):
    te = te if te is not None else load()
    cu_q, cu_k = spec.cu_seqlens(q.device)
    mask, window = _mask(spec)
    rng_state = torch.zeros(2, dtype=torch.int64, device=q.device)  # unused without dropout
    aux = [lse_to_stats(lse, spec, packed_stats(te)), rng_state]
    dq, dk, dv = te.fused_attn_bwd(
        spec.max_q, spec.max_k, cu_q, cu_k, q.contiguous(), k.contiguous(), v.contiguous(),
        out.to(q.dtype).contiguous(), dout.to(q.dtype).contiguous(), q.dtype, aux,
        te.FusedAttnBackend["F16_arbitrary_seqlen"], cu_seqlens_q_padded=cu_q, cu_seqlens_kv_padded=cu_k,
        attn_scale=scale, dropout=0.0, qkv_layout=LAYOUT, attn_bias_type="no_bias", attn_mask_type=mask,
        window_size=window, deterministic=False,
        **_newer(te.fused_attn_bwd, ("o_format", "do_format", "dqkv_layout")))[:3]
    return dq, dk, dv
