"""Kernel checks against the float64 oracle, shared by the CPU suite and the GPU check.

``zigzag_case`` runs documents the way a zigzag ring of G members does, on one device and one
process: each document is cut into 2G chunks (odd lengths give unequal or empty chunks: a member
may hold nothing), member i holds chunks i and 2G-1-i of every document, and at step s member i
attends the block of member (i - s) mod G. Each step is ONE ``attend_blocks`` call for every member
and document, each member's block its own K/V tensor (as the engine runs every ring of a queue step
in one call, each ring's message its own tensor); the backward runs the same calls from the final
out and lse, each block's dK/dV into its own buffer. G=1 is the local queue (every document whole,
one causal varlen call). The result is compared with per-document causal
attention in float64 (reference.py).

>>> errs = zigzag_case("cpu_flash", [9, 4, 1], members=3, heads=4, kv_heads=2, dtype=torch.float64)
>>> max(errs.values()) < 1e-12
True
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from megatron_zeppelin.attention.reference import reference_attention
from megatron_zeppelin.attention.kernels import attend_blocks, attend_blocks_backward, segment_mask


def _layout(lengths: Sequence[int], members: int) -> List[List[Tuple[int, int, int]]]:
    """Per member: its (doc, start, stop) segments, chunk i before chunk 2G-1-i."""
    out: List[List[Tuple[int, int, int]]] = [[] for _ in range(members)]
    for d, L in enumerate(lengths):
        b = [L * j // (2 * members) for j in range(2 * members + 1)]
        for i in range(members):
            for c in (i, 2 * members - 1 - i):
                if b[c + 1] > b[c]:
                    out[i].append((d, b[c], b[c + 1]))
    return out


def zigzag_case(backend, lengths: Sequence[int], members: int, heads: int, kv_heads: int, dim: int = 16,
                dtype=torch.bfloat16, device="cpu", seed: int = 0) -> Dict[str, float]:
    """Relative errors (max |x - ref| / max |ref|) of out, dq, dk, dv against float64."""
    g = torch.Generator().manual_seed(seed)
    t = sum(lengths)
    q, k, v, dout = (torch.randn(t, h, dim, generator=g, dtype=torch.float64) for h in (heads, kv_heads, kv_heads, heads))
    starts = [sum(lengths[:d]) for d in range(len(lengths))]
    layout = _layout(lengths, members)
    rows, row_of = [], {}
    for segs in layout:  # the zigzag tensor: members' segments concatenated
        for s in segs:
            row_of[s] = len(rows)
            rows.extend(range(starts[s[0]] + s[1], starts[s[0]] + s[2]))
    idx = torch.tensor(rows, dtype=torch.long)
    zq, zk, zv, zdo = (x[idx].to(device=device, dtype=dtype) for x in (q, k, v, dout))
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    out = torch.zeros(zq.shape, dtype=acc, device=device)
    lse = torch.full(zq.shape[:2], float("-inf"), dtype=acc, device=device)

    first = [0]  # member b's rows are [first[b], first[b + 1]) of the zigzag tensor: its block
    for segs in layout:
        first.append(first[-1] + sum(s[2] - s[1] for s in segs))

    def pairs(i, b):  # member i's query rows x key rows inside member b's block
        for qs in layout[i]:
            for ks in layout[b]:
                run, off = segment_mask(qs[1], qs[2], ks[1], ks[2]) if qs[0] == ks[0] else (False, None)
                if run:
                    qa, ka = row_of[qs], row_of[ks] - first[b]
                    yield slice(qa, qa + qs[2] - qs[1]), slice(ka, ka + ks[2] - ks[1]), off

    def blk(x, b):
        return x[first[b]:first[b + 1]].clone()  # the block as its own tensor (a received message)

    steps = [[(i, (i - s) % members) for i in range(members)] for s in range(members)]
    for step in steps:
        attend_blocks(zq, [(blk(zk, b), blk(zv, b), list(pairs(i, b))) for i, b in step], out, lse, _scale(dim),
                      backend)
    o = out.to(dtype)
    dq, dk, dv = (torch.zeros(x.shape, dtype=acc, device=device) for x in (zq, zk, zv))
    for step in steps:
        items = [(blk(zk, b), blk(zv, b), torch.zeros_like(blk(dk, b)), torch.zeros_like(blk(dv, b)), list(pairs(i, b)))
                 for i, b in step]
        attend_blocks_backward(zdo, zq, o, lse, dq, items, _scale(dim), backend)
        for (i, b), (_, _, gk, gv, _) in zip(step, items):
            dk[first[b]:first[b + 1]] += gk
            dv[first[b]:first[b + 1]] += gv
    rq, rk, rv = (x.clone().requires_grad_(True) for x in (q, k, v))
    ref = reference_attention(rq, rk, rv, list(lengths), _scale(dim))
    ref.backward(dout)
    errs = {}
    for name, got, want in (("out", o, ref.detach()), ("dq", dq, rq.grad), ("dk", dk, rk.grad), ("dv", dv, rv.grad)):
        diff = (got.double().cpu() - want[idx]).abs().max()
        errs[name] = (diff / want.abs().max().clamp_min(1e-30)).item()
    return errs


def _scale(dim: int) -> float:
    return dim ** -0.5
