"""Block compute of one ring member: its query segments against the K/V blocks of one Compute
(every ring of a queue at a step), forward and backward, in one kernel call.

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

from megatron_zeppelin.planner.types import Ring
from megatron_zeppelin.attention.kernels import attend_blocks, attend_blocks_backward, segment_mask
from megatron_zeppelin.attention.view import RankView


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


def attend(view: RankView, items, q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, scale: float,
           backend) -> None:
    """Merge this member's attention over every block of one Compute into (out, lse): ``items`` =
    [(ring, b, kv)] (block ``b`` of ``ring`` as its message ``kv``), all rings and steps in one
    varlen kernel call (kernels.attend_blocks)."""
    d = q.shape[2]
    blocks = []
    for ring, b, kv in items:
        k, v = unpack_kv(kv, kv.shape[1] // (2 * d), d)
        blocks.append((k, v, list(_pairs(view, ring, b))))
    attend_blocks(q, blocks, out, lse, scale, backend)


def attend_backward(view: RankView, items, q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                    dout: torch.Tensor, dq: torch.Tensor, scale: float, backend) -> None:
    """Add this member's share of dQ (into ``dq``) and of each block's dK/dV (into its ``dkv``) for
    ``items`` = [(ring, b, kv, dkv)], in one varlen kernel call."""
    d = q.shape[2]
    blocks = []
    for ring, b, kv, dkv in items:
        kvh = kv.shape[1] // (2 * d)
        k, v = unpack_kv(kv, kvh, d)
        dk, dv = unpack_kv(dkv, kvh, d)
        blocks.append((k, v, dk, dv, list(_pairs(view, ring, b))))
    attend_blocks_backward(dout, q, out, lse, dq, blocks, scale, backend)
