"""Attention throughput by length and GEMM throughput, measured with the kernels the engine runs.

Attention FLOPs are counted exactly as the cost model counts them (planner/cost_model.py: a causal
block of L tokens is 2*L*(L+1)*heads*head_dim forward FLOPs; the backward is 2.5x), so a measured rate
plugs straight into the profile: the cost model then reproduces the measured times.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from ..attention.kernels import block_backward, block_forward
from ..planner.cost_model import BWD_FLOPS
from .timing import best_seconds


def attention_rates(lengths: Sequence[int], heads: int, kv_heads: int, head_dim: int, device: str,
                    dtype: torch.dtype, repeats: int = 5) -> List[Dict[str, float]]:
    """[{seqlen, fwd_tflops, bwd_tflops, fwd_s, bwd_s}] for one causal document of each length."""
    out = []
    scale = head_dim ** -0.5
    for L in lengths:
        g = torch.Generator(device="cpu").manual_seed(L)
        q = torch.randn(L, heads, head_dim, generator=g).to(device, dtype)
        k = torch.randn(L, kv_heads, head_dim, generator=g).to(device, dtype)
        v = torch.randn(L, kv_heads, head_dim, generator=g).to(device, dtype)
        o, lse = block_forward(q, k, v, scale, causal_offset=0)
        do = torch.randn_like(o)
        fwd = best_seconds(lambda: block_forward(q, k, v, scale, causal_offset=0), device, repeats)
        bwd = best_seconds(lambda: block_backward(do, q, k, v, o, lse, scale, causal_offset=0), device, repeats)
        flops = 2.0 * L * (L + 1) * heads * head_dim
        out.append({"seqlen": int(L), "fwd_s": fwd, "bwd_s": bwd, "fwd_tflops": flops / fwd / 1e12,
                    "bwd_tflops": BWD_FLOPS * flops / bwd / 1e12})
    return out


def gemm_rate(shapes: Sequence[Sequence[int]], device: str, dtype: torch.dtype, repeats: int = 5) -> Dict:
    """Best TFLOP/s of ``a[m,k] @ b[k,n]`` over ``shapes`` (like a MAMF sweep, on the model's shapes)."""
    best = {"tflops": 0.0}
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        t = best_seconds(lambda: a @ b, device, repeats)
        r = 2.0 * m * n * k / t / 1e12
        if r > best["tflops"]:
            best = {"tflops": r, "shape": [m, n, k], "seconds": t}
    return best
