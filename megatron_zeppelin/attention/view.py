"""RankView: one rank's share of a Plan, as row offsets the attention engine can index with.

The rank's tensors hold its attention-layout segments concatenated (``plan.attention_layout[rank]``).
A ring member's K/V *block* is its segments of the ring's documents, ring-document order, chunk i
before chunk 2G-1-i: the rows of the message that travels in the schedule.

Worked example: a document of 6 tokens on an intra ring (0, 1) plus a local document of 3 on rank 1.

>>> from megatron_zeppelin.planner.types import DocPlan, Ring, Segment
>>> from megatron_zeppelin.planner.build.layout import attention_layout
>>> docs = (DocPlan(0, 6, "intra", 0, -1, (0, 1, 3, 4, 6)), DocPlan(1, 3, "local", -1, 1, (0, 3)))
>>> rings = (Ring(0, (0, 1), "intra", (0,)),)
>>> v = RankView.build(docs, rings, attention_layout(docs, rings, 2), rank=1)
>>> v.tokens, v.offset[Segment(1, 0, 3)]      # rank 1 holds doc 0 rows [1,3) and [3,4), then doc 1
(6, 3)
>>> v.block(rings[0], 0)                        # member 0's block: chunks 0 and 3 of doc 0
((Segment(doc=0, start=0, stop=1), 0), (Segment(doc=0, start=4, stop=6), 1))
>>> v.block_rows(rings[0], 0), v.member[0]
(3, 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

from megatron_zeppelin.planner.types import DocPlan, PlanError, Ring, Segment
from megatron_zeppelin.spec.words import DocClass


@dataclass(frozen=True)
class RankView:
    rank: int
    tokens: int
    offset: Dict[Segment, int]  # segment -> first row in this rank's attention-layout tensors
    member: Dict[int, int]  # ring id -> this rank's member index
    docs: Dict[int, DocPlan]
    local: Tuple[Segment, ...]  # this rank's local documents, layout order

    @classmethod
    def build(cls, docs: Sequence[DocPlan], rings: Sequence[Ring],
              layout: Sequence[Sequence[Segment]], rank: int) -> "RankView":
        offset, row = {}, 0
        for s in layout[rank]:
            if s in offset:
                raise PlanError(f"rank {rank} holds segment {s} twice in its attention layout")
            offset[s] = row
            row += len(s)
        dmap = {d.doc: d for d in docs}
        member = {r.id: r.ranks.index(rank) for r in rings if rank in r.ranks}
        is_local = DocClass.LOCAL  # bound once (spec/words.py)
        local = tuple(s for s in layout[rank] if dmap[s.doc].cls == is_local)
        return cls(rank, row, offset, member, dmap, local)

    def block(self, ring: Ring, b: int) -> Tuple[Tuple[Segment, int], ...]:
        """Segments of member ``b``'s block with their first row inside the block message."""
        out, row = [], 0
        for d in ring.docs:
            for s in self.docs[d].member_segments(b):
                out.append((s, row))
                row += len(s)
        return tuple(out)

    def block_rows(self, ring: Ring, b: int) -> int:
        return sum(len(s) for s, _ in self.block(ring, b))

    def own_rows(self, ring: Ring):
        """Rows (as index list) of this rank's own block in its tensors, block order."""
        idx = []
        for s, _ in self.block(ring, self.member[ring.id]):
            a = self.offset[s]
            idx.extend(range(a, a + len(s)))
        return idx
