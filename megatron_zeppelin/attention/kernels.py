"""Attention kernels behind one adapter: one (query block, key/value block) pair -> (out, lse).

Ring attention needs partial outputs *with* their log-sum-exp so partial results can be merged
(merge.py), and a backward that takes the *final* output and LSE (the FlashAttention trick: then
each block's backward is exact on its own). Shapes, token-major as the engine holds them:

    q: [sq, heads, d]   k, v: [sk, kv_heads, d]   out: [sq, heads, d]   lse: [sq, heads]

GQA: query head j reads K/V head j // (heads // kv_heads) (Megatron's grouping).

Masks: ``causal_offset=None`` is a full block (every key visible: the key chunk lies before the query
chunk); otherwise key k is visible to query q iff ``k <= q + causal_offset`` (block-local indices).
``causal_offset=0`` with sq == sk is the causal diagonal block.

Backends: ``cpu_flash`` (torch's CPU flash attention op, float32/float64), ``cuda_flash`` (torch's
CUDA flash op, fp16/bf16, imported lazily and never needed on CPU), ``torch`` (explicit matmuls: any
device, dtype and offset). ``auto`` picks the fastest that supports the call.

>>> import torch
>>> q = torch.randn(3, 2, 4, dtype=torch.float64); kv = torch.randn(3, 1, 4, dtype=torch.float64)
>>> o1, l1 = block_forward(q, kv, kv, 0.5, causal_offset=0, backend="cpu_flash")
>>> o2, l2 = block_forward(q, kv, kv, 0.5, causal_offset=0, backend="torch")
>>> o1.shape, l1.shape, bool(torch.allclose(o1, o2) and torch.allclose(l1, l2))
(torch.Size([3, 2, 4]), torch.Size([3, 2]), True)
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..errors import ZeppelinError

BACKENDS = ("auto", "cpu_flash", "cuda_flash", "torch")


class KernelError(ZeppelinError):
    pass


def _pick(backend: str, q: torch.Tensor, causal_offset: Optional[int], square: bool) -> str:
    if backend not in BACKENDS:
        raise KernelError(f"unknown attention backend {backend!r} (choose one of {', '.join(BACKENDS)})")
    plain = causal_offset is None or (causal_offset == 0 and square)
    if backend != "auto":
        if backend != "torch" and not plain:
            return "torch"  # flash ops only know full and top-left causal masks
        return backend
    if not plain:
        return "torch"
    if q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64):
        return "cpu_flash"
    if q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16):
        return "cuda_flash"
    return "torch"


def _expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    # [s, kvh, d] -> [s, heads, d]: query head j uses kv head j // group
    g = heads // x.shape[1]
    return x if g == 1 else x.repeat_interleave(g, dim=1)


def _reduce_kv(dx: torch.Tensor, kv_heads: int) -> torch.Tensor:
    # [s, heads, d] -> [s, kvh, group, d] -> sum over the group -> [s, kvh, d]
    s, h, d = dx.shape
    return dx if h == kv_heads else dx.view(s, kv_heads, h // kv_heads, d).sum(2)


def _bhsd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).unsqueeze(0)  # [s, h, d] -> [1, h, s, d]


def _shd(x: torch.Tensor) -> torch.Tensor:
    return x.squeeze(0).transpose(0, 1)  # [1, h, s, d] -> [s, h, d]


def _mask(sq: int, sk: int, causal_offset: Optional[int], device) -> Optional[torch.Tensor]:
    if causal_offset is None:
        return None
    qi = torch.arange(sq, device=device).unsqueeze(1)
    ki = torch.arange(sk, device=device).unsqueeze(0)
    return ki <= qi + causal_offset  # [sq, sk] True = visible


def _scores(q, k, scale, causal_offset):
    # q [sq, h, d], k [sk, h, d] -> scores [h, sq, sk]
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    m = _mask(q.shape[0], k.shape[0], causal_offset, q.device)
    return s if m is None else s.masked_fill(~m, float("-inf"))


def block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                  causal_offset: Optional[int] = None, backend: str = "auto"
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention of one block: (out [sq, h, d], lse [sq, h]). A query row that sees no key gets
    out 0 and lse -inf (merge.py treats that as 'no contribution')."""
    sq, h, d = q.shape
    sk = k.shape[0]
    if sq == 0 or sk == 0:
        return q.new_zeros(q.shape), q.new_full((sq, h), float("-inf"))
    be = _pick(backend, q, causal_offset, sq == sk)
    ke, ve = _expand_kv(k, h), _expand_kv(v, h)
    if be in ("cpu_flash", "cuda_flash"):
        if be == "cpu_flash":
            o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                _bhsd(q), _bhsd(ke), _bhsd(ve), 0.0, causal_offset is not None, scale=scale)
        else:
            o, lse = torch.ops.aten._scaled_dot_product_flash_attention(
                _bhsd(q), _bhsd(ke), _bhsd(ve), 0.0, causal_offset is not None, False, scale=scale)[:2]
        o, lse = _shd(o), lse.squeeze(0).transpose(0, 1).to(torch.promote_types(q.dtype, torch.float32))
        # the flash ops turn a NaN row into out 0: put the NaN back (NaN in, NaN out; never silent)
        poison = q.sum(-1) * 0 + (k.sum() + v.sum()) * 0  # [sq, h], 0 or NaN
        return o + poison.unsqueeze(-1).to(o.dtype), lse + poison.to(lse.dtype)
    s = _scores(q, ke, scale, causal_offset)  # [h, sq, sk]
    lse = torch.logsumexp(s, dim=-1)  # [h, sq]
    p = torch.exp(s - lse.unsqueeze(-1))
    p = torch.where(torch.isneginf(lse).unsqueeze(-1), torch.zeros_like(p), p)  # rows with no key
    o = torch.einsum("hqk,khd->qhd", p, ve)
    return o, lse.transpose(0, 1)


def block_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, scale: float,
                   causal_offset: Optional[int] = None, backend: str = "auto"
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This block's share of (dq, dk, dv), given the *final* merged ``out`` and ``lse`` of the
    query rows (so the block's softmax probabilities are exact: P = exp(S - lse))."""
    sq, h, d = q.shape
    sk, kvh = k.shape[0], k.shape[1]
    if sq == 0 or sk == 0:
        return q.new_zeros(q.shape), k.new_zeros(k.shape), v.new_zeros(v.shape)
    be = _pick(backend, q, causal_offset, sq == sk)
    ke, ve = _expand_kv(k, h), _expand_kv(v, h)
    causal = causal_offset is not None
    if be == "cpu_flash":
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            _bhsd(dout).contiguous(), _bhsd(q), _bhsd(ke), _bhsd(ve), _bhsd(out).contiguous(),
            lse.transpose(0, 1).unsqueeze(0).contiguous(), 0.0, causal, scale=scale)
        return _shd(dq), _reduce_kv(_shd(dk).contiguous(), kvh), _reduce_kv(_shd(dv).contiguous(), kvh)
    if be == "cuda_flash":
        z = torch.zeros((), dtype=torch.int64, device=q.device)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            _bhsd(dout).contiguous(), _bhsd(q), _bhsd(ke), _bhsd(ve), _bhsd(out).contiguous(),
            lse.transpose(0, 1).unsqueeze(0).contiguous(), z, z, sq, sk, 0.0, causal, z, z, scale=scale)
        return _shd(dq), _reduce_kv(_shd(dk).contiguous(), kvh), _reduce_kv(_shd(dv).contiguous(), kvh)
    s = _scores(q, ke, scale, causal_offset)  # [h, sq, sk]
    ls = lse.transpose(0, 1).to(s.dtype).unsqueeze(-1)
    p = torch.exp(s - ls)
    p = torch.where(torch.isneginf(ls), torch.zeros_like(p), p)  # rows with no key
    dv_e = torch.einsum("hqk,qhd->khd", p, dout)
    dp = torch.einsum("qhd,khd->hqk", dout, ve)
    delta = (dout * out).sum(-1).transpose(0, 1).unsqueeze(-1)  # [h, sq, 1]
    ds = p * (dp - delta) * scale
    dq = torch.einsum("hqk,khd->qhd", ds, ke)
    dk_e = torch.einsum("hqk,qhd->khd", ds, q)
    return dq, _reduce_kv(dk_e, kvh), _reduce_kv(dv_e, kvh)


def segment_mask(q_start: int, q_stop: int, k_start: int, k_stop: int) -> Tuple[bool, Optional[int]]:
    """(run?, causal_offset) for query positions [q_start, q_stop) against key positions
    [k_start, k_stop) of the same document under causal attention.

    >>> segment_mask(4, 6, 0, 2), segment_mask(2, 4, 2, 4), segment_mask(0, 2, 4, 6), segment_mask(2, 5, 0, 4)
    ((True, None), (True, 0), (False, None), (True, 2))
    """
    if q_stop <= q_start or k_stop <= k_start or k_start >= q_stop:
        return False, None
    if k_stop - 1 <= q_start:
        return True, None  # every key at or before the first query: full block
    return True, q_start - k_start
