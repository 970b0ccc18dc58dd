"""Remap plan: from the attention layout to a token-balanced linear layout at least traffic.

Targets: every rank holds floor(T/W) or ceil(T/W) linear tokens; the extra tokens go to the ranks
that already hold the most (fewest moves). Surplus ranks send the *tail* of their attention layout
(kept tokens keep their order); receivers append what they get in source-rank order. Moves are chosen
greedily: first inside each node (NVLink), then across nodes, largest surplus first.

Worked example: ranks 0 and 1 of one node hold 5 and 1 tokens.

>>> from megatron_zeppelin.topology import Topology
>>> from megatron_zeppelin.planner.types import Segment
>>> att = ((Segment(0, 0, 5),), (Segment(1, 0, 1),))
>>> lin, moves = plan_remap(att, Topology(1, 2))
>>> lin
((Segment(doc=0, start=0, stop=3),), (Segment(doc=1, start=0, stop=1), Segment(doc=0, start=3, stop=5)))
>>> moves
(Move(src=0, dst=1, segments=(Segment(doc=0, start=3, stop=5),)),)
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from ..topology import Topology
from .types import Move, Segment


def balanced_targets(counts: Sequence[int]) -> List[int]:
    total, w = sum(counts), len(counts)
    base, extra = divmod(total, w)
    order = sorted(range(w), key=lambda r: (-counts[r], r))
    tgt = [base] * w
    for r in order[:extra]:
        tgt[r] += 1
    return tgt


def transfer_matrix(counts: Sequence[int], targets: Sequence[int], topo: Topology) -> Dict[Tuple[int, int], int]:
    """Tokens src -> dst: greedy, intra-node pairs first, then across nodes (largest first)."""
    surplus = {r: c - t for r, (c, t) in enumerate(zip(counts, targets)) if c > t}
    deficit = {r: t - c for r, (c, t) in enumerate(zip(counts, targets)) if c < t}
    flows: Dict[Tuple[int, int], int] = {}

    def match(pairs_ok):
        for s in sorted(surplus, key=lambda r: (-surplus[r], r)):
            for d in sorted(deficit, key=lambda r: (-deficit[r], r)):
                if surplus.get(s, 0) == 0:
                    break
                if deficit.get(d, 0) == 0 or not pairs_ok(s, d):
                    continue
                n = min(surplus[s], deficit[d])
                flows[(s, d)] = flows.get((s, d), 0) + n
                surplus[s] -= n
                deficit[d] -= n
        for m in (surplus, deficit):
            for r in [r for r, v in m.items() if v == 0]:
                del m[r]

    match(topo.same_node)
    match(lambda s, d: True)
    return flows


def _take_tail(segs: List[Segment], n: int) -> Tuple[List[Segment], List[Segment]]:
    """Split ``segs`` into (kept head, tail of n tokens)."""
    kept, tail = list(segs), []
    while n > 0:
        s = kept.pop()
        if len(s) <= n:
            tail.insert(0, s)
            n -= len(s)
        else:
            cut = s.stop - n
            kept.append(Segment(s.doc, s.start, cut))
            tail.insert(0, Segment(s.doc, cut, s.stop))
            n = 0
    return kept, tail


def plan_remap(attention_layout: Sequence[Sequence[Segment]], topo: Topology
               ) -> Tuple[Tuple[Tuple[Segment, ...], ...], Tuple[Move, ...]]:
    counts = [sum(len(s) for s in r) for r in attention_layout]
    flows = transfer_matrix(counts, balanced_targets(counts), topo)
    kept = [list(r) for r in attention_layout]
    moves: List[Move] = []
    # Each sender gives its tail away, destinations in rank order (deterministic).
    for src in range(len(kept)):
        dsts = sorted(d for (s, d) in flows if s == src)
        for dst in reversed(dsts):
            kept[src], tail = _take_tail(kept[src], flows[(src, dst)])
            moves.append(Move(src, dst, tuple(tail)))
    moves.sort(key=lambda m: (m.src, m.dst))
    linear = [list(k) for k in kept]
    for m in moves:
        linear[m.dst].extend(m.segments)
    return tuple(tuple(r) for r in linear), tuple(moves)
