"""Bins (nodes or ranks) for the partitioner's greedy: pick the bin whose time is lowest AFTER
adding a piece, in O(log n).

A bin's time is ``att + penalty(tok)``: with the remap layer on, the penalty is ``c * |tok - mean|``
(the remap of its token surplus or deficit); without it, ``c * tok`` (its linear time). Plain LPT
(add to the least-loaded bin) is wrong for the first form: a bin short of tokens *gains* from a
short document while a bin with surplus only loses. So: if the piece lowers the time of the most
loaded bin short of tokens, it goes there (that lowers the makespan); otherwise to the bin whose
time after adding is lowest (bins short of ``mean`` and the others sit in separate min-heaps, and
the two tops are compared). Stale heap entries are skipped by a per-bin version.

>>> b = Bins([0, 1], mean=10, c=1.0, deficit=True)
>>> b.pick(att=0.5, tok=4, room=lambda i, t: True)   # both 10 short; tie -> bin 0
0
>>> b.add(0, 0.5, 4); b.time(0), b.time(1)
(6.5, 10.0)
>>> b.pick(att=1.0, tok=4, room=lambda i, t: True)   # lowers bin 1 (the most loaded short one)
1
>>> b.pick(att=5.0, tok=4, room=lambda i, t: True)   # lowers none; after: bin 0 -> 9.5, bin 1 -> 11.0
0
"""

from __future__ import annotations

import heapq
from typing import Callable, Dict, List, Sequence


class Bins:
    def __init__(self, ids: Sequence[int], mean: float, c: float, deficit: bool,
                 att: Dict[int, float] = None, tok: Dict[int, int] = None):
        self.mean, self.c, self.deficit = mean, c, deficit
        self.att = {i: (att or {}).get(i, 0.0) for i in ids}
        self.tok = {i: (tok or {}).get(i, 0) for i in ids}
        self.ver = {i: 0 for i in ids}
        self.heaps: List[list] = [[], [], []]  # [short of mean, at or over mean, short (max-heap)]
        for i in ids:
            self._push(i)

    def time_of(self, att: float, tok: float) -> float:
        return att + self.c * (abs(tok - self.mean) if self.deficit else tok)

    def time(self, i: int) -> float:
        return self.time_of(self.att[i], self.tok[i])

    def _push(self, i: int) -> None:
        short = self.deficit and self.tok[i] < self.mean
        heapq.heappush(self.heaps[0 if short else 1], (self.time(i), i, self.ver[i]))
        if short:
            heapq.heappush(self.heaps[2], (-self.time(i), i, self.ver[i]))

    def _top(self, h: int, tok: int, room: Callable[[int, int], bool]):
        """Best valid entry of heap h with room (entries without room are set aside, then put back)."""
        heap, aside, found = self.heaps[h], [], None
        while heap:
            t, i, v = heap[0]
            if v != self.ver[i]:
                heapq.heappop(heap)
                continue
            if room(i, tok):
                found = i
                break
            aside.append(heapq.heappop(heap))
        for x in aside:
            heapq.heappush(heap, x)
        return found

    def pick(self, att: float, tok: int, room: Callable[[int, int], bool]):
        """Where (att, tok) goes (see the module docstring); ties by bin id; None if none has room."""
        if self.deficit:
            i = self._top(2, tok, room)
            if i is not None and self.time_of(self.att[i] + att, self.tok[i] + tok) < self.time(i):
                return i
        best = None
        for h in (0, 1):
            i = self._top(h, tok, room)
            if i is None:
                continue
            key = (self.time_of(self.att[i] + att, self.tok[i] + tok), i)
            if best is None or key < best:
                best = key
        return None if best is None else best[1]

    def add(self, i: int, att: float, tok: int) -> None:
        self.att[i] += att
        self.tok[i] += tok
        self.ver[i] += 1
        self._push(i)
