"""Pairs -> varlen calls: one (queue, step)'s attention for all its documents in at most two calls.

The engine describes a step's work as *pairs* ``(query rows, key rows, causal_offset)`` of its
tensors: ``causal_offset=None`` is a full block (every key visible), otherwise key m (block-local)
is visible to query j iff ``m <= j + causal_offset`` (segment_mask computes it from positions; a
zigzag diagonal chunk is offset 0, an all-gathered prefix ``q_start - k_start``). Each pair splits
into at most two *pieces* that every varlen kernel knows (varlen.py):

- a bottom-right causal piece: query rows ``[a, b)`` with ``a = max(0, -off)``, ``b = min(sq, sk - off)``
  against keys ``[0, b + off)`` (then keys - queries = a + off, exactly the offset);
- a full piece: the rows ``[b, sq)`` that see every key.

Rows ``j < -off`` see no key and stay (out 0, lse -inf). All causal pieces of a step go into one
call and all full pieces into another; q/k/v rows are gathered (or sliced, when the rows are one
contiguous run, as for the local queue), and results merge into the step's accumulators by LSE
(merge.merge_rows), so a query row that appears in several pieces is exact. The key rows of the
pairs may index several K/V tensors (one per ring of a queue step: ``blocks_forward``), still one
call per mask kind.

>>> split_pair(slice(0, 5), slice(0, 5), 0)          # the causal diagonal: one causal piece
[(True, (0, 5), (0, 5))]
>>> split_pair(slice(10, 13), slice(0, 4), 2)        # queries 2..4 of a doc vs keys 0..3
[(True, (10, 12), (0, 4)), (False, (12, 13), (0, 4))]
>>> split_pair(slice(0, 4), slice(4, 6), None)       # full block
[(False, (0, 4), (4, 6))]
>>> split_pair(slice(0, 4), slice(0, 6), -2)         # queries 0, 1 see nothing
[(True, (2, 4), (0, 2))]
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..merge import merge_rows
from .varlen import Varlen

Pair = Tuple[slice, slice, Optional[int]]
Piece = Tuple[bool, Tuple[int, int], Tuple[int, int]]  # (causal, query rows, key rows)


def split_pair(qr: slice, kr: slice, off: Optional[int]) -> List[Piece]:
    sq, sk = qr.stop - qr.start, kr.stop - kr.start
    if sq <= 0 or sk <= 0:
        return []
    if off is None:
        return [(False, (qr.start, qr.stop), (kr.start, kr.stop))]
    a, b = max(0, -off), min(sq, sk - off)
    out: List[Piece] = []
    if a < b:
        out.append((True, (qr.start + a, qr.start + b), (kr.start, kr.start + b + off)))
    if max(a, b) < sq:
        out.append((False, (qr.start + max(a, b), qr.stop), (kr.start, kr.stop)))
    return out


class Call:
    """One varlen call: its spec, the query rows it packs, and its key rows per source tensor."""

    def __init__(self, causal: bool, pieces: Sequence[Tuple[int, Tuple[int, int], Tuple[int, int]]]):
        self.spec = Varlen(tuple(p[1][1] - p[1][0] for p in pieces), tuple(p[2][1] - p[2][0] for p in pieces),
                           causal)
        self.q_rows = _rows([p[1] for p in pieces])
        self.k_parts = []  # (source, rows, row count): pieces come in source order, so each source is one run
        for src in sorted({p[0] for p in pieces}):
            ranges = [p[2] for p in pieces if p[0] == src]
            self.k_parts.append((src, _rows(ranges), sum(b - a for a, b in ranges)))


def _rows(ranges: Sequence[Tuple[int, int]]):
    """A slice when the ranges are one contiguous increasing run, else the row indices (numpy)."""
    if all(ranges[i][1] == ranges[i + 1][0] for i in range(len(ranges) - 1)):
        return slice(ranges[0][0], ranges[-1][1])
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges])


def plan_calls(sources: Sequence[Sequence[Pair]]) -> List[Call]:
    """The calls for pairs whose key rows index several K/V tensors (``sources[i]``: pairs of tensor i)."""
    causal, full = [], []
    for src, pairs in enumerate(sources):
        for qr, kr, off in pairs:
            for c, qrange, krange in split_pair(qr, kr, off):
                (causal if c else full).append((src, qrange, krange))
    return [Call(c, ps) for c, ps in ((True, causal), (False, full)) if ps]


def _take(x: torch.Tensor, rows, index_cache: dict):
    if isinstance(rows, slice):
        return x[rows]
    key = (id(rows), x.device)
    if key not in index_cache:
        index_cache[key] = torch.from_numpy(rows).to(x.device)
    return x.index_select(0, index_cache[key])


def _gather(xs: Sequence[torch.Tensor], call: Call, index_cache: dict) -> torch.Tensor:
    parts = [_take(xs[src], rows, index_cache) for src, rows, _ in call.k_parts]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _add(acc: torch.Tensor, rows, val: torch.Tensor, index_cache: dict) -> None:
    if isinstance(rows, slice):
        acc[rows] += val.to(acc.dtype)
    else:
        acc.index_add_(0, index_cache[(id(rows), acc.device)], val.to(acc.dtype))


def _rows_arg(rows, device, index_cache):
    return rows if isinstance(rows, slice) else index_cache[(id(rows), device)]


def blocks_forward(kernel, q, blocks, out, lse, scale: float) -> None:
    """Merge the attention of ``blocks`` = [(k, v, pairs)] (each pair's key rows index its own k/v)
    into the accumulators (out [t, h, d], lse [t, h]) in place. ``kernel`` is a backend's
    ``forward(q, k, v, spec, scale)`` (select.py)."""
    cache: dict = {}
    ks, vs = [b[0] for b in blocks], [b[1] for b in blocks]
    for c in plan_calls([b[2] for b in blocks]):
        o, l = kernel(_take(q, c.q_rows, cache), _gather(ks, c, cache), _gather(vs, c, cache), c.spec, scale)
        merge_rows(out, lse, _rows_arg(c.q_rows, q.device, cache), o, l)


def blocks_backward(kernel, dout, q, out, lse, dq, blocks, scale: float) -> None:
    """Add the gradients of ``blocks`` = [(k, v, dk, dv, pairs)] into dq and each block's dk, dv
    (given the *final* out and lse of the query rows)."""
    cache: dict = {}
    ks, vs = [b[0] for b in blocks], [b[1] for b in blocks]
    for c in plan_calls([b[4] for b in blocks]):
        gq, gk, gv = kernel(_take(dout, c.q_rows, cache), _take(q, c.q_rows, cache), _gather(ks, c, cache),
                            _gather(vs, c, cache), _take(out, c.q_rows, cache), _take(lse, c.q_rows, cache),
                            c.spec, scale)
        _add(dq, c.q_rows, gq, cache)
        a = 0
        for src, rows, n in c.k_parts:
            _add(blocks[src][2], rows, gk[a:a + n], cache)
            _add(blocks[src][3], rows, gv[a:a + n], cache)
            a += n


def pairs_forward(kernel, q, k, v, pairs: Sequence[Pair], out, lse, scale: float) -> None:
    blocks_forward(kernel, q, [(k, v, pairs)], out, lse, scale)


def pairs_backward(kernel, dout, q, k, v, out, lse, pairs: Sequence[Pair], dq, dk, dv, scale: float) -> None:
    blocks_backward(kernel, dout, q, out, lse, dq, [(k, v, dk, dv, pairs)], scale)
