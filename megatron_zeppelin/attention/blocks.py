"""Block compute of one ring member: its query segments against one K/V block, forward and backward.

K/V travel as one message per block: row = [K row (kv_heads*d) | V row (kv_heads*d)], so a message
is ``[rows, 2*kv_heads*d]`` and any row range of it is a valid piece for the executor. Pairs of
(query segment, key segment) of the same document get their causal mask from positions
(kernels.segment_mask); keys after the queries are skipped.

>>> import torch
>>> k, v = torch.zeros(3, 2, 4), torch.ones(3, 2, 4)
>>> kv = pack_kv(k, v); kv.shape                   # 3 rows of [2 heads x 4 | 2 heads x 4]
torch.Size([3, 16])
>>> [bool((a == b).all()) for a, b in zip(unpack_kv(kv, 2, 4), (k, v))]
[True, True]
"""

from __future__ import annotations

import torch

from ..planner.types import Ring
from .kernels import attend_pairs, attend_pairs_backward, segment_mask
from .view import RankView


def pack_kv(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    n = k.shape[0]
    c = k.shape[1] * k.shape[2]
    return torch.cat([k.reshape(n, c), v.reshape(n, c)], dim=1)  # [n, kvh, d] x2 -> [n, 2*kvh*d]


def unpack_kv(kv: torch.Tensor, kv_heads: int, d: int):
    n, c = kv.shape[0], kv_heads * d
    return kv[:, :c].view(n, kv_heads, d), kv[:, c:].view(n, kv_heads, d)  # views: writes land in kv


def _pairs(view: RankView, ring: Ring, b: int):
    """(query rows slice, key rows slice in the block, causal_offset) for member's queries x block b."""
    mine = view.block(ring, view.member[ring.id])
    theirs = view.block(ring, b)
    for qs, _ in mine:
        qa = view.offset[qs]
        for ks, ka in theirs:
            if ks.doc != qs.doc:
                continue
            run, off = segment_mask(qs.start, qs.stop, ks.start, ks.stop)
            if run:
                yield slice(qa, qa + len(qs)), slice(ka, ka + len(ks)), off


def attend(view: RankView, ring: Ring, b: int, kv: torch.Tensor, q: torch.Tensor,
           out: torch.Tensor, lse: torch.Tensor, scale: float, backend: str) -> None:
    """Merge this member's attention over block ``b`` (message ``kv``) into (out, lse)."""
    k, v = unpack_kv(kv, kv.shape[1] // (2 * q.shape[2]), q.shape[2])
    attend_pairs(q, k, v, list(_pairs(view, ring, b)), out, lse, scale, backend)  # one varlen call per mask kind


def attend_backward(view: RankView, ring: Ring, b: int, kv: torch.Tensor, dkv: torch.Tensor,
                    q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor,
                    dq: torch.Tensor, scale: float, backend: str) -> None:
    """Add this member's share of dQ (into ``dq``) and of block b's dK/dV (into ``dkv``)."""
    d = q.shape[2]
    kvh = kv.shape[1] // (2 * d)
    k, v = unpack_kv(kv, kvh, d)
    dk, dv = unpack_kv(dkv, kvh, d)
    attend_pairs_backward(dout, q, k, v, out, lse, list(_pairs(view, ring, b)), dq, dk, dv, scale, backend)
