"""The CPU backends of the varlen interface: ``cpu_flash`` and ``reference``.

``cpu_flash`` is torch's CPU flash-attention op (``aten._scaled_dot_product_flash_attention_for_cpu``
and its ``_backward``; ``[batch, heads, seq, d]``, float32/float64, lse ``[batch, heads, seq]``), one
call per sequence: it knows only full and top-left causal masks, so a bottom-right causal sequence
with more keys than queries (a zigzag chunk that sees an earlier chunk fully and itself causally)
runs as a full call over its first ``sk - sq`` keys and a causal one over the last ``sq``, merged by
LSE (backward: each part from the final out and lse). ``reference`` is explicit
matmuls in the input dtype (float64 makes it the oracle); it materialises ``[heads, sq, sk]`` per
sequence, so it is a CPU and test path, never chosen for fp16/bf16 on a GPU.

>>> import torch
>>> from .varlen import Varlen
>>> g = torch.Generator().manual_seed(0)
>>> q, k = torch.randn(5, 2, 4, dtype=torch.float64, generator=g), torch.randn(7, 1, 4, dtype=torch.float64, generator=g)
>>> spec = Varlen((3, 2), (3, 4), causal=True)
>>> a, la = forward("cpu_flash", q, k, k, spec, 0.5)
>>> b, lb = forward("reference", q, k, k, spec, 0.5)
>>> bool(torch.allclose(a, b) and torch.allclose(la, lb)), a.shape, la.shape
(True, torch.Size([5, 2, 4]), torch.Size([5, 2]))
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from megatron_zeppelin.attention.merge import merge
from megatron_zeppelin.attention.kernels.varlen import Varlen
from megatron_zeppelin.spec.words import KernelBackend

_CPU_FLASH = KernelBackend.CPU_FLASH  # bound once: compared per sequence (spec/words.py)


def _expand(x: torch.Tensor, heads: int) -> torch.Tensor:
    g = heads // x.shape[1]  # [s, kvh, d] -> [s, heads, d]: query head j uses kv head j // g
    return x if g == 1 else x.repeat_interleave(g, dim=1)


def _reduce(dx: torch.Tensor, kv_heads: int) -> torch.Tensor:
    s, h, d = dx.shape  # [s, heads, d] -> sum over each kv head's group -> [s, kvh, d]
    return dx if h == kv_heads else dx.reshape(s, kv_heads, h // kv_heads, d).sum(2)


def _bhsd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).unsqueeze(0)  # [s, h, d] -> [1, h, s, d]


def _shd(x: torch.Tensor) -> torch.Tensor:
    return x.squeeze(0).transpose(0, 1)  # [1, h, s, d] -> [s, h, d]


def _scores(q, k, scale, offset: Optional[int]):
    s = torch.einsum("qhd,khd->hqk", q, k) * scale  # [h, sq, sk]
    if offset is None:
        return s
    m = torch.arange(k.shape[0], device=q.device)[None, :] <= torch.arange(q.shape[0], device=q.device)[:, None] + offset
    return s.masked_fill(~m, float("-inf"))


def _flash_ok(dtype, causal: bool, sq: int, sk: int) -> bool:
    return dtype in (torch.float32, torch.float64) and (not causal or sq == sk)


def _acc(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _seq_forward(backend, q, k, v, scale, causal):
    sq, h, _ = q.shape
    sk = k.shape[0]
    if backend == _CPU_FLASH and causal and sk > sq and _flash_ok(q.dtype, False, sq, sk):
        p = sk - sq  # keys [0, p) seen by every query, [p, sk) top-left causal
        o1, l1 = _seq_forward(backend, q, k[:p], v[:p], scale, False)
        o2, l2 = _seq_forward(backend, q, k[p:], v[p:], scale, True)
        return merge(o1, l1, o2, l2)
    ke, ve = _expand(k, h), _expand(v, h)
    if backend == _CPU_FLASH and _flash_ok(q.dtype, causal, sq, sk):
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            _bhsd(q), _bhsd(ke), _bhsd(ve), 0.0, causal, scale=scale)
        o, lse = _shd(o), lse.squeeze(0).transpose(0, 1)
        # the op turns a NaN row into output 0: put the NaN back (NaN in, NaN out; never silent)
        poison = q.sum(-1) * 0 + (k.sum() + v.sum()) * 0  # [sq, h], 0 or NaN
        return o + poison.unsqueeze(-1).to(o.dtype), lse + poison.to(lse.dtype)
    s = _scores(q, ke, scale, sk - sq if causal else None)
    lse = torch.logsumexp(s, dim=-1)  # [h, sq]
    p = torch.exp(s - lse.unsqueeze(-1))
    return torch.einsum("hqk,khd->qhd", p, ve), lse.transpose(0, 1)


def _seq_backward(backend, dout, q, k, v, out, lse, scale, causal):
    sq, h, _ = q.shape
    sk, kvh = k.shape[0], k.shape[1]
    if backend == _CPU_FLASH and causal and sk > sq and _flash_ok(q.dtype, False, sq, sk):
        p = sk - sq
        a = _seq_backward(backend, dout, q, k[:p], v[:p], out, lse, scale, False)
        b = _seq_backward(backend, dout, q, k[p:], v[p:], out, lse, scale, True)
        return a[0] + b[0], torch.cat([a[1], b[1]]), torch.cat([a[2], b[2]])
    ke, ve = _expand(k, h), _expand(v, h)
    if backend == _CPU_FLASH and _flash_ok(q.dtype, causal, sq, sk):
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            _bhsd(dout).contiguous(), _bhsd(q), _bhsd(ke), _bhsd(ve), _bhsd(out).contiguous(),
            lse.transpose(0, 1).unsqueeze(0).contiguous().to(q.dtype), 0.0, causal, scale=scale)
        return _shd(dq), _reduce(_shd(dk), kvh), _reduce(_shd(dv), kvh)
    s = _scores(q, ke, scale, sk - sq if causal else None)
    p = torch.exp(s - lse.transpose(0, 1).to(s.dtype).unsqueeze(-1))  # exact with the final lse
    dv_e = torch.einsum("hqk,qhd->khd", p, dout)
    dp = torch.einsum("qhd,khd->hqk", dout, ve)
    delta = (dout * out).sum(-1).transpose(0, 1).unsqueeze(-1)  # [h, sq, 1]
    ds = p * (dp - delta) * scale
    return (torch.einsum("hqk,khd->qhd", ds, ke), _reduce(torch.einsum("hqk,qhd->khd", ds, q), kvh),
            _reduce(dv_e, kvh))


def forward(backend: str, q, k, v, spec: Varlen, scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    out = q.new_empty(q.shape)
    lse = torch.empty(q.shape[:2], dtype=_acc(q.dtype), device=q.device)
    cq, ck = spec.cu_q, spec.cu_k
    for i in range(len(spec.seqlens_q)):
        rq, rk = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        o, l = _seq_forward(backend, q[rq], k[rk], v[rk], scale, spec.causal)
        out[rq], lse[rq] = o, l.to(lse.dtype)
    return out, lse


def backward(backend: str, dout, q, k, v, out, lse, spec: Varlen, scale: float):
    dq, dk, dv = q.new_empty(q.shape), k.new_zeros(k.shape), v.new_zeros(v.shape)
    cq, ck = spec.cu_q, spec.cu_k
    for i in range(len(spec.seqlens_q)):
        rq, rk = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        a, b, c = _seq_backward(backend, dout[rq], q[rq], k[rk], v[rk], out[rq], lse[rq], scale, spec.causal)
        dq[rq], dk[rk], dv[rk] = a, b, c  # sequences of one call never share key rows
    return dq, dk, dv
