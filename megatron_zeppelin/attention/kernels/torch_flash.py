"""``torch_flash``: torch's own CUDA varlen FlashAttention-2 ops, the default on CUDA (no extra package).

Written against the schemas of torch 2.13 (the CPU build, where tests bind these arguments to
``torch.ops.aten.<op>.default._schema``) and pytorch/pytorch's
``aten/src/ATen/native/transformers/cuda/attention_backward.cu`` (commit 00afd8f2: the varlen branch
runs when cum_seq_q is defined). Only the positional arguments and ``scale`` are passed; that the
GPU machine's torch 2.11 takes them the same way is what scripts/gpu_check.sh confirms:

    _flash_attention_forward(Tensor query, Tensor key, Tensor value, Tensor? cum_seq_q,
        Tensor? cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p, bool is_causal,
        bool return_debug_mask, *, float? scale=None, ...)
        -> (Tensor output, Tensor softmax_logsumexp, Tensor rng_state, Tensor unused, Tensor debug_attn_mask)
    _flash_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out,
        Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt max_k,
        float dropout_p, bool is_causal, Tensor rng_state, Tensor unused, *, float? scale=None, ...)

q ``[total_q, heads, d]``, k/v ``[total_k, kv_heads, d]`` (native GQA), fp16/bf16, cu_seqlens int32
1-D. With cu_seqlens defined the ops take FlashAttention's varlen branch (mha_varlen_fwd/bwd), whose
logsumexp is ``[heads, total_q]`` float32 (torch/_meta_registrations.py) and whose causal mask is
bottom-right aligned per sequence. The rng tensors are read only when dropout_p > 0 (never here), so
the backward gets placeholders of the forward's shapes instead of per-call saved state.
"""

from __future__ import annotations

import torch

from megatron_zeppelin.attention.kernels.varlen import Varlen


def forward_args(q, k, v, spec: Varlen, scale: float):
    cu_q, cu_k = spec.cu_seqlens(q.device)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # K/V may be views into a ring message
    return (q, k, v, cu_q, cu_k, spec.max_q, spec.max_k, 0.0, spec.causal, False), {"scale": scale}


def backward_args(dout, q, k, v, out, lse, spec: Varlen, scale: float):
    cu_q, cu_k = spec.cu_seqlens(q.device)
    seed = torch.zeros(2, dtype=torch.int64, device=q.device)  # unused without dropout
    offset = torch.zeros((), dtype=torch.int64, device=q.device)
    lse_hq = lse.transpose(0, 1).float().contiguous()  # [total_q, h] -> [h, total_q]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return ((dout.to(q.dtype).contiguous(), q, k, v, out.to(q.dtype).contiguous(), lse_hq, cu_q, cu_k, spec.max_q, spec.max_k, 0.0,
             spec.causal, seed, offset), {"scale": scale})


def forward(q, k, v, spec: Varlen, scale: float, ops=None):
    ops = ops if ops is not None else torch.ops.aten
    args, kwargs = forward_args(q, k, v, spec, scale)
    out, lse = ops._flash_attention_forward(*args, **kwargs)[:2]
    return out, lse.transpose(0, 1)  # [h, total_q] -> [total_q, h]


def backward(dout, q, k, v, out, lse, spec: Varlen, scale: float, ops=None):
    ops = ops if ops is not None else torch.ops.aten
    args, kwargs = backward_args(dout, q, k, v, out, lse, spec, scale)
    dq, dk, dv = ops._flash_attention_backward(*args, **kwargs)
    return dq, dk, dv
