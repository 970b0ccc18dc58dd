"""Attention layout: which token segments each rank holds for attention, and zigzag chunking.

A document split over a ring of G ranks is cut into 2G chunks as equal as integers allow (no
padding: a length not divisible by 2G gives chunks differing by one token); member i holds chunks i
and 2G-1-i. Per rank the segments are in queue order: inter rings, intra rings (ring order, then the
ring's documents in order, chunk i before chunk 2G-1-i), then local documents in document order.

>>> zigzag_bounds(10, 2)   # 4 chunks of 10 tokens: 2, 3, 2, 3
(0, 2, 5, 7, 10)
>>> from megatron_zeppelin.planner.types import DocPlan, Ring
>>> docs = [DocPlan(0, 10, "intra", 0, -1, zigzag_bounds(10, 2)), DocPlan(1, 3, "local", -1, 1, (0, 3))]
>>> lay = attention_layout(docs, [Ring(0, (0, 1), "intra", (0,))], 2)
>>> [[(s.doc, s.start, s.stop) for s in r] for r in lay]
[[(0, 0, 2), (0, 7, 10)], [(0, 2, 5), (0, 5, 7), (1, 0, 3)]]
"""

from __future__ import annotations

from functools import lru_cache
from operator import attrgetter
from typing import Dict, List, Optional, Sequence, Tuple

from megatron_zeppelin.planner.types import DocPlan, Ring, Segment, ring_documents
from megatron_zeppelin.spec.words import DocClass

@lru_cache(maxsize=1 << 16)  # pure: a plan's CP shapes bound and build each (length, size) two or three times
def zigzag_bounds(length: int, ring_size: int) -> Tuple[int, ...]:
    n = 2 * ring_size
    return tuple([(j * length) // n for j in range(n + 1)])  # a list first: half a generator's cost


def _segment(doc: int, start: int, stop: int, _new=object.__new__, _set=object.__setattr__) -> Segment:
    """Segment(doc, start, stop) without the frozen dataclass's per-field __setattr__ (a CP shape over
    a ring of 64 holds 128k of them for 1k documents: most of its layout's time); the fields are
    those of its __init__, so it equals, orders, pickles and hashes the same.

    >>> _segment(3, 0, 5) == Segment(3, 0, 5) and hash(_segment(3, 0, 5)) == hash(Segment(3, 0, 5))
    True
    """
    s = _new(Segment)
    _set(s, "__dict__", {"doc": doc, "start": start, "stop": stop})
    return s


def attention_layout(docs: Sequence[DocPlan], rings: Sequence[Ring], world: int, local: Optional[List[DocPlan]] = None
                     ) -> Tuple[Tuple[Segment, ...], ...]:
    """``local``: the local documents in document order, where the caller has them."""
    dmap: Dict[int, DocPlan] = ring_documents(docs, rings)
    out: List[List[Segment]] = [[] for _ in range(world)]
    seg = _segment
    for ring in rings:
        g2 = 2 * ring.size
        bounds = [(d, dmap[d].bounds) for d in ring.docs]
        for i, rank in enumerate(ring.ranks):
            add = out[rank].append
            for d, b in bounds:  # member i: chunks i and 2G-1-i (DocPlan.member_segments)
                if b[i + 1] > b[i]:
                    add(seg(d, b[i], b[i + 1]))
                if b[g2 - i] > b[g2 - 1 - i]:
                    add(seg(d, b[g2 - 1 - i], b[g2 - i]))
    if local is None:
        cls = DocClass.LOCAL  # bound once per call (spec/words.py)
        local = sorted((d for d in docs if d.cls == cls), key=attrgetter("doc"))
    for d in local:
        out[d.owner].append(seg(d.doc, 0, d.length))
    return tuple(tuple(r) for r in out)
