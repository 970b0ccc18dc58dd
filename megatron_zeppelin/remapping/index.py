"""Row bookkeeping of one rank's remap: which rows it sends to whom, and how it assembles its output.

Pure (numpy), computed once per (plan, rank, direction) and cached by the layer. Direction
``to_linear`` follows ``plan.remap`` forward (a Move src -> dst sends its segments from the src's
attention layout into the dst's linear layout); ``to_attention`` runs the same moves reversed.

Rows are in layout order: row i of a rank's tensor is the i-th token of its segments concatenated.
The output is gathered from a *pool*: the input rows (0 .. n_in-1) followed by the received rows
(n_in ..), received from group rank 0 first, each peer's segments in move order. Both the send
buffer and the output are described as runs [start, stop) of rows, coalesced.

Worked example: rank 0 of two holds document 0 (5 tokens) for attention and sends its tail
[3, 5) to rank 1, whose linear layout is document 1 then the received tokens.

>>> from megatron_zeppelin.planner.types import Move, Segment
>>> att = ((Segment(0, 0, 5),), (Segment(1, 0, 1),))
>>> lin = ((Segment(0, 0, 3),), (Segment(1, 0, 1), Segment(0, 3, 5)))
>>> moves = (Move(0, 1, (Segment(0, 3, 5),)),)
>>> ix0 = build_index(att, lin, moves, 0, "to_linear")
>>> ix0.send_counts, ix0.send_runs, ix0.recv_counts, ix0.out_runs
((0, 2), ((3, 5),), (0, 0), ((0, 3),))
>>> ix1 = build_index(att, lin, moves, 1, "to_linear")
>>> ix1.recv_counts, ix1.out_runs   # pool = [doc 1 token 0, doc 0 tokens 3, 4]
((2, 0), ((0, 3),))
>>> build_index(att, lin, moves, 1, "to_attention").send_runs   # the way back: rows 1, 2 of rank 1
((1, 3),)
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.planner.types import Move, Segment

DIRECTIONS = ("to_linear", "to_attention")
Runs = Tuple[Tuple[int, int], ...]


class RemapLayoutError(ZeppelinError):
    """A plan whose remap moves do not match its layouts (or a tensor that does not match the plan)."""


@dataclass(frozen=True)
class RemapIndex:
    n_in: int  # rows of the input (this rank's source layout)
    n_out: int  # rows of the output (this rank's destination layout)
    send_counts: Tuple[int, ...]  # rows to each group rank (own entry 0: kept rows stay in the pool)
    recv_counts: Tuple[int, ...]  # rows from each group rank
    send_runs: Runs  # input rows, concatenated in order, forming the send buffer
    out_runs: Runs  # pool rows (input, then received), concatenated in order, forming the output


class _Locator:
    """Row of any token of a set of segments laid out at given row offsets."""

    def __init__(self):
        self._iv: Dict[int, List[Tuple[int, int, int]]] = {}

    def add(self, segs: Sequence[Segment], offset: int) -> int:
        for s in segs:
            self._iv.setdefault(s.doc, []).append((s.start, s.stop, offset))
            offset += len(s)
        return offset

    def freeze(self) -> None:
        for v in self._iv.values():
            v.sort()
        self._starts = {d: [a for a, _, _ in v] for d, v in self._iv.items()}

    def runs(self, seg: Segment, where: str) -> List[Tuple[int, int]]:
        iv, starts = self._iv.get(seg.doc, []), self._starts.get(seg.doc, [])
        out, pos = [], seg.start
        while pos < seg.stop:
            k = bisect_right(starts, pos) - 1
            if k < 0 or iv[k][1] <= pos:
                raise RemapLayoutError(f"remap: token {pos} of document {seg.doc} is not in the {where}")
            a, b, off = iv[k]
            stop = min(seg.stop, b)
            out.append((off + pos - a, off + stop - a))
            pos = stop
        return out


def _coalesce(runs: List[Tuple[int, int]]) -> Runs:
    out: List[List[int]] = []
    for a, b in runs:
        if out and out[-1][1] == a:
            out[-1][1] = b
        elif b > a:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def build_index(attention_layout: Sequence[Sequence[Segment]], linear_layout: Sequence[Sequence[Segment]],
                moves: Sequence[Move], rank: int, direction: str) -> RemapIndex:
    if direction not in DIRECTIONS:
        raise RemapLayoutError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    world = len(attention_layout)
    fwd = direction == "to_linear"
    src_lay = (attention_layout if fwd else linear_layout)[rank]
    dst_lay = (linear_layout if fwd else attention_layout)[rank]
    # (peer, segments) this rank sends / receives in this direction, in plan order.
    out_msgs = [(m.dst if fwd else m.src, m.segments) for m in moves if (m.src if fwd else m.dst) == rank]
    in_msgs = [(m.src if fwd else m.dst, m.segments) for m in moves if (m.dst if fwd else m.src) == rank]
    if any(p == rank for p, _ in out_msgs):
        raise RemapLayoutError(f"remap: rank {rank} has a move to itself")
    src_loc = _Locator()
    n_in = src_loc.add(src_lay, 0)
    src_loc.freeze()
    send_counts, send_runs = [0] * world, []
    for peer, segs in sorted(out_msgs, key=lambda x: x[0]):  # stable: plan order within a peer
        for s in segs:
            send_runs += src_loc.runs(s, f"source layout of rank {rank}")
            send_counts[peer] += len(s)
    pool = _Locator()
    pool.add(src_lay, 0)
    off, recv_counts = n_in, [0] * world
    for peer, segs in sorted(in_msgs, key=lambda x: x[0]):
        off = pool.add(segs, off)
        recv_counts[peer] += sum(len(s) for s in segs)
    pool.freeze()
    out_runs: List[Tuple[int, int]] = []
    for s in dst_lay:
        out_runs += pool.runs(s, f"tokens rank {rank} holds or receives")
    n_out = sum(len(s) for s in dst_lay)
    if n_in - sum(send_counts) + sum(recv_counts) != n_out:
        raise RemapLayoutError(f"remap: rank {rank} keeps {n_in - sum(send_counts)} rows and receives "
                               f"{sum(recv_counts)} but its {direction[3:]} layout has {n_out}")
    return RemapIndex(n_in, n_out, tuple(send_counts), tuple(recv_counts),
                      _coalesce(send_runs), _coalesce(out_runs))
