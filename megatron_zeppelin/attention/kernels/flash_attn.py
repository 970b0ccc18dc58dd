"""``flash_attn``: Dao-AILab flash-attn's varlen functions, when the package is installed.

Written against flash-attn 2.8.4 (github.com/Dao-AILab/flash-attention, commit 0251105a,
``flash_attn/flash_attn_interface.py``), the functions ring-attention code calls because they return
the LSE and take it back:

    _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        dropout_p, softmax_scale, causal, window_size_left=-1, window_size_right=-1, softcap=0.0,
        alibi_slopes=None, return_softmax=False, block_table=None, leftpad_k=None, seqused_k=None,
        zero_tensors=False, num_splits=0) -> (out, softmax_lse, S_dmask, rng_state)
    _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q,
        cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
        window_size_left, window_size_right, softcap, alibi_slopes, deterministic,
        rng_state=None, zero_tensors=False) -> softmax_d   (dq, dk, dv written in place)

softmax_lse is ``[heads, total_q]`` float32 (since 2.6; before, ``[batch, heads, max_seqlen_q]``),
causal is bottom-right aligned, GQA native (kv heads divide q heads). Versions before 2.6 are
refused by name.
"""

from __future__ import annotations

import torch

from megatron_zeppelin.attention.kernels.varlen import KernelError, Varlen

MIN_VERSION = (2, 6)


def load():
    """The flash-attn interface module, or a KernelError saying how to get or avoid it."""
    try:
        import flash_attn
        from flash_attn import flash_attn_interface
    except ImportError as e:
        raise KernelError(f"the flash_attn attention kernel needs the flash-attn package ({e}): install "
                          "flash-attn>=2.6 or choose another --zeppelin-attention-kernel") from e
    ver = tuple(int(x) for x in flash_attn.__version__.split(".")[:2])
    if ver < MIN_VERSION:
        raise KernelError(f"flash-attn {flash_attn.__version__} returns a padded LSE; the flash_attn kernel "
                          "needs flash-attn>=2.6 (or choose another --zeppelin-attention-kernel)")
    return flash_attn_interface


def forward(q, k, v, spec: Varlen, scale: float, fa=None):
    fa = fa if fa is not None else load()
    cu_q, cu_k = spec.cu_seqlens(q.device)
    out, lse = fa._flash_attn_varlen_forward(
        q.contiguous(), k.contiguous(), v.contiguous(), cu_q, cu_k, spec.max_q, spec.max_k, 0.0, scale,
        spec.causal, window_size_left=-1, window_size_right=-1, softcap=0.0, alibi_slopes=None,
        return_softmax=False)[:2]
    return out, lse.transpose(0, 1)  # [h, total_q] -> [total_q, h]


def backward(dout, q, k, v, out, lse, spec: Varlen, scale: float, fa=None):
    fa = fa if fa is not None else load()
    cu_q, cu_k = spec.cu_seqlens(q.device)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    fa._flash_attn_varlen_backward(
        dout.to(q.dtype).contiguous(), q, k, v, out.to(q.dtype).contiguous(),
        lse.transpose(0, 1).float().contiguous(), dq, dk, dv, cu_q, cu_k, spec.max_q, spec.max_k, 0.0, scale,
        spec.causal, -1, -1, 0.0, None, False, rng_state=None)
    return dq, dk, dv
