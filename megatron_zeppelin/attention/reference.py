"""The oracle: per-document causal attention in plain torch, each document run whole and alone.

Used by tests to check every distributed path. Inputs are token-major ``[t, heads, d]`` (K/V with
``kv_heads``), documents concatenated in order; float64 gives ~1e-15 agreement with itself.

>>> import torch
>>> q = torch.randn(5, 2, 4, dtype=torch.float64); k = torch.randn(5, 1, 4, dtype=torch.float64)
>>> out = reference_attention(q, k, k, [2, 3])
>>> bool(torch.allclose(out[:2], reference_attention(q[:2], k[:2], k[:2], [2])))   # documents are independent
True
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: Sequence[int],
                        softmax_scale: Optional[float] = None) -> torch.Tensor:
    """Causal attention within each document of ``lengths`` (differentiable through autograd)."""
    if sum(lengths) != q.shape[0]:
        raise ValueError(f"lengths sum to {sum(lengths)} but q has {q.shape[0]} tokens")
    h, d = q.shape[1], q.shape[2]
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    g = h // k.shape[1]
    outs, a = [], 0
    for L in lengths:
        qd = q[a:a + L]
        kd = k[a:a + L].repeat_interleave(g, dim=1)  # [L, kvh, d] -> [L, h, d]
        vd = v[a:a + L].repeat_interleave(g, dim=1)
        s = torch.einsum("qhd,khd->hqk", qd, kd) * scale  # [h, L, L]
        mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
        outs.append(torch.einsum("hqk,khd->qhd", p, vd))
        a += L
    return torch.cat(outs) if outs else q.new_zeros(q.shape)
