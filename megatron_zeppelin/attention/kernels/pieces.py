"""Pairs -> varlen calls: one (queue, step)'s attention for all its documents and rings in one call.

The engine describes a step's work as *pairs* ``(query rows, key rows, causal_offset)`` of its
tensors: ``causal_offset=None`` is a full block (every key visible), otherwise key m (block-local)
is visible to query j iff ``m <= j + causal_offset`` (segment_mask computes it from positions; a
zigzag diagonal chunk is offset 0, an all-gathered prefix ``q_start - k_start``). Each pair splits
into at most two *pieces* that every varlen kernel knows (varlen.py):

- a bottom-right causal piece: query rows ``[a, b)`` with ``a = max(0, -off)``, ``b = min(sq, sk - off)``
  against keys ``[0, b + off)`` (then keys - queries = a + off, exactly the offset);
- a full piece: the rows ``[b, sq)`` that see every key.

Rows ``j < -off`` see no key and stay (out 0, lse -inf). Pieces of the same query rows become one
*sequence* (``sequences``): the full keys first, then the causal run, which is still bottom-right
causal. So a step is one causal varlen call; a second, full, call is made only where some query rows
(more than one) see nothing but full keys while others see a causal run, which no engine step has
(zigzag and all-gather chunks of a document align: a ring's own block is all causal, every later
block all full). q/k/v rows are gathered (or sliced, when the rows are one contiguous run, as for
the local queue), and results merge into the step's accumulators by LSE (merge.merge_rows), so a
query row that appears in several sequences is exact. The key rows may index several K/V tensors
(one per ring and step of a queue's Compute: ``blocks_forward``), still one call.

>>> split_pair(slice(0, 5), slice(0, 5), 0)          # the causal diagonal: one causal piece
[(True, (0, 5), (0, 5))]
>>> split_pair(slice(10, 13), slice(0, 4), 2)        # queries 2..4 of a doc vs keys 0..3
[(True, (10, 12), (0, 4)), (False, (12, 13), (0, 4))]
>>> split_pair(slice(0, 4), slice(4, 6), None)       # full block
[(False, (0, 4), (4, 6))]
>>> split_pair(slice(0, 4), slice(0, 6), -2)         # queries 0, 1 see nothing
[(True, (2, 4), (0, 2))]

A zigzag member's own block (chunk rows 0:2 and 2:5 of one document; the later chunk sees the
earlier fully): one causal call of two sequences, the second with both chunks' keys.

>>> [(c.spec.causal, c.spec.seqlens_q, c.spec.seqlens_k) for c in plan_calls(
...     [[(slice(0, 2), slice(0, 2), 0), (slice(2, 5), slice(0, 2), None), (slice(2, 5), slice(2, 5), 0)]])]
[(True, (2, 3), (2, 5))]
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from megatron_zeppelin.attention.merge import merge_rows
from megatron_zeppelin.attention.kernels.varlen import Varlen

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


Seq = Tuple[Tuple[int, int], List[Tuple[int, Tuple[int, int]]]]  # (query rows, [(source, key rows)])


def sequences(sources: Sequence[Sequence[Pair]]) -> Tuple[List[Seq], List[Seq]]:
    """(causal sequences, full sequences) of pairs whose key rows index several K/V tensors
    (``sources[i]``: the pairs of tensor i). Pieces of the same query rows become one sequence: the
    full keys first, then the causal run (bottom-right alignment counts from the sequence's first
    key, so every query sees the prepended keys). A zigzag member's own block is then one causal
    call (its later chunk sees the earlier one fully and itself causally), a later ring step one full
    call, and several rings' or steps' blocks of the same queries one sequence."""
    groups: Dict[Tuple[int, int], Tuple[list, list]] = {}
    for src, pairs in enumerate(sources):
        for qr, kr, off in pairs:
            for c, qrange, krange in split_pair(qr, kr, off):
                groups.setdefault(qrange, ([], []))[0 if c else 1].append((src, krange))
    any_causal = any(cs for cs, _ in groups.values())
    causal: List[Seq] = []
    full: List[Seq] = []
    for qrange, (cs, fs) in groups.items():  # row order kept: the call's query rows stay one slice
        if cs:
            causal.append((qrange, fs + cs[:1]))
            causal.extend((qrange, [c]) for c in cs[1:])  # the same rows again: merged by LSE
        elif any_causal and qrange[1] - qrange[0] == 1:  # one query sees every key under bottom-right
            causal.append((qrange, fs))                  # causal too: no second call for it
        else:
            full.append((qrange, fs))
    return causal, full


class Call:
    """One varlen call: its spec, the query rows it packs, and per source tensor the key rows it
    takes and where they go in the call's packed K/V."""

    def __init__(self, causal: bool, seqs: Sequence[Seq]):
        self.spec = Varlen(tuple(q[1] - q[0] for q, _ in seqs),
                           tuple(sum(b - a for _, (a, b) in ks) for _, ks in seqs), causal)
        self.q_rows = _rows([q for q, _ in seqs])
        self.q_unique = isinstance(self.q_rows, slice) or len(np.unique(self.q_rows)) == len(self.q_rows)
        per_src: Dict[int, Tuple[list, list]] = {}
        pos = 0
        for _, ks in seqs:
            for src, (a, b) in ks:
                rows, dest = per_src.setdefault(src, ([], []))
                rows.append((a, b))
                dest.append((pos, pos + b - a))
                pos += b - a
        self.total_k = pos
        self.k_parts = [(src, _rows(r), _rows(d)) for src, (r, d) in sorted(per_src.items())]


def _rows(ranges: Sequence[Tuple[int, int]]):
    """A slice when the ranges are one contiguous increasing run, else the row indices (numpy)."""
    if all(ranges[i][1] == ranges[i + 1][0] for i in range(len(ranges) - 1)):
        return slice(ranges[0][0], ranges[-1][1])
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges])


def plan_calls(sources: Sequence[Sequence[Pair]]) -> List[Call]:
    """The calls of a step: one causal and, only where some query rows see nothing but full keys
    while others see a causal run, one full (``sources[i]``: the pairs of K/V tensor i)."""
    causal, full = sequences(sources)
    return [Call(c, seqs) for c, seqs in ((True, causal), (False, full)) if seqs]


def _index(rows, device, cache: dict) -> torch.Tensor:
    key = (id(rows), str(device))
    if key not in cache:
        cache[key] = torch.from_numpy(rows).to(device)
    return cache[key]


def _take(x: torch.Tensor, rows, cache: dict):
    return x[rows] if isinstance(rows, slice) else x.index_select(0, _index(rows, x.device, cache))


def _gather(xs: Sequence[torch.Tensor], call: Call, cache: dict) -> torch.Tensor:
    """The call's packed K (or V): each source's key rows put at their places."""
    if len(call.k_parts) == 1 and call.k_parts[0][2] == slice(0, call.total_k):
        return _take(xs[call.k_parts[0][0]], call.k_parts[0][1], cache)
    x0 = xs[call.k_parts[0][0]]
    out = x0.new_empty((call.total_k,) + tuple(x0.shape[1:]))
    for src, rows, dest in call.k_parts:
        val = _take(xs[src], rows, cache)
        if isinstance(dest, slice):
            out[dest] = val
        else:
            out.index_copy_(0, _index(dest, out.device, cache), val)
    return out


def _add(acc: torch.Tensor, rows, val: torch.Tensor, cache: dict) -> None:
    if isinstance(rows, slice):
        acc[rows] += val.to(acc.dtype)
    else:  # a row may repeat (one key row in several sequences): index_add sums every occurrence
        acc.index_add_(0, _index(rows, acc.device, cache), val.to(acc.dtype))


def _rows_arg(rows, device, cache):
    return rows if isinstance(rows, slice) else _index(rows, device, cache)


def blocks_forward(kernel, q, blocks, out, lse, scale: float) -> None:
    """Merge the attention of ``blocks`` = [(k, v, pairs)] (each pair's key rows index its own k/v)
    into the accumulators (out [t, h, d], lse [t, h]) in place. ``kernel`` is a backend's
    ``forward(q, k, v, spec, scale)`` (select.py)."""
    cache: dict = {}
    ks, vs = [b[0] for b in blocks], [b[1] for b in blocks]
    for c in plan_calls([b[2] for b in blocks]):
        o, l = kernel(_take(q, c.q_rows, cache), _gather(ks, c, cache), _gather(vs, c, cache), c.spec, scale)
        merge_rows(out, lse, _rows_arg(c.q_rows, q.device, cache), o, l, unique=c.q_unique)


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
        for src, rows, dest in c.k_parts:
            _add(blocks[src][2], rows, _take(gk, dest, cache), cache)
            _add(blocks[src][3], rows, _take(gv, dest, cache), cache)


def pairs_forward(kernel, q, k, v, pairs: Sequence[Pair], out, lse, scale: float) -> None:
    blocks_forward(kernel, q, [(k, v, pairs)], out, lse, scale)


def pairs_backward(kernel, dout, q, k, v, out, lse, pairs: Sequence[Pair], dq, dk, dv, scale: float) -> None:
    blocks_backward(kernel, dout, q, out, lse, dq, [(k, v, dk, dv, pairs)], scale)
