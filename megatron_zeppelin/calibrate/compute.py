"""Attention throughput by length and GEMM throughput, measured with the kernels the engine runs.

Attention FLOPs are counted exactly as the cost model counts them (planner/cost/cost_model.py: a causal
block of L tokens is 2*L*(L+1)*heads*head_dim forward FLOPs; the backward is 2.5x), so a measured rate
plugs straight into the profile: the cost model then reproduces the measured times.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from megatron_zeppelin.attention.kernels import block_backward, block_forward
from megatron_zeppelin.planner.cost.cost_model import BWD_FLOPS
from megatron_zeppelin.calibrate.timing import all_seconds


def attention_rates(lengths: Sequence[int], heads: int, kv_heads: int, head_dim: int, device: str,
                    dtype: torch.dtype, repeats: int = 5) -> List[Dict[str, float]]:
    """[{seqlen, fwd_tflops, bwd_tflops, fwd_s, bwd_s, fwd_spread, bwd_spread}] for one causal document of
    each length; a spread is the slowest repeat over the fastest (how much the machine's load varied)."""
    out = []
    scale = head_dim ** -0.5
    for L in lengths:
        g = torch.Generator(device="cpu").manual_seed(L)
        q = torch.randn(L, heads, head_dim, generator=g).to(device, dtype)
        k = torch.randn(L, kv_heads, head_dim, generator=g).to(device, dtype)
        v = torch.randn(L, kv_heads, head_dim, generator=g).to(device, dtype)
        o, lse = block_forward(q, k, v, scale, causal_offset=0)
        do = torch.randn_like(o)
        fwd = all_seconds(lambda: block_forward(q, k, v, scale, causal_offset=0), device, repeats)
        bwd = all_seconds(lambda: block_backward(do, q, k, v, o, lse, scale, causal_offset=0), device, repeats)
        out.append(attention_record(L, heads, head_dim, min(fwd), min(bwd), max(fwd) / min(fwd), max(bwd) / min(bwd)))
    return out


def attention_record(L: int, heads: int, head_dim: int, fwd_s: float, bwd_s: float, fwd_spread: float = 1.0,
                     bwd_spread: float = 1.0) -> Dict[str, float]:
    """One length's measurement, with its rates counted as the cost model counts FLOPs."""
    flops = 2.0 * L * (L + 1) * heads * head_dim
    return {"seqlen": int(L), "fwd_s": fwd_s, "bwd_s": bwd_s, "fwd_tflops": flops / fwd_s / 1e12,
            "bwd_tflops": BWD_FLOPS * flops / bwd_s / 1e12, "fwd_spread": fwd_spread, "bwd_spread": bwd_spread}


def gemm_rate(shapes: Sequence[Sequence[int]], device: str, dtype: torch.dtype, repeats: int = 5) -> Dict:
    """Best TFLOP/s of ``a[m,k] @ b[k,n]`` over ``shapes`` (like a MAMF sweep, on the model's shapes)."""
    best = {"tflops": 0.0}
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        ts = all_seconds(lambda: a @ b, device, repeats)
        t = min(ts)
        r = 2.0 * m * n * k / t / 1e12
        if r > best["tflops"]:
            best = {"tflops": r, "shape": [m, n, k], "seconds": t, "spread": max(ts) / t}
    return best
