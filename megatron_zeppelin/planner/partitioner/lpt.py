"""LPT for the short documents, in numpy batches with the one-at-a-time result.

The greedy (partition.py) visits documents longest first and gives every short one (at most
``local_max`` tokens: it always stays whole) to the rank of least (load, rank) with room for it.
Those documents are the tail of the visiting order, most of a batch, and one heap operation each in
Python was most of the greedy's time. A batch does many at once: with the ranks sorted by (load,
rank), loads l_0 <= l_1 <= ..., the batch's documents costing u_0, u_1, ... in visiting order,
document m goes to the m-th rank as long as that rank has room and its load is below every load
the batch has raised so far, l_m < min_{j<m} (l_j + u_j): then no earlier document of the batch
made another rank lighter than it. The longest such prefix is placed at once (each rank once, the
same float additions as one at a time). Ranks without room for a batch's first document sit it
out (documents come longest first, so they have room for none of the batch but the ones short
enough for the roomiest of them, where the batch ends): a tight token cap (memory_choice.memory_cap)
fills ranks early, and one document at a time past that point was most of a capped greedy's time.

Worked example: loads 0, 5, 1; documents costing 4, 3, 3, 1 (one token each). One at a time:
4 -> rank 0 (4), 3 -> rank 2 (4), 3 -> rank 0 (ties by rank; 7), 1 -> rank 2 (5). In batches:
ranks 0, 2, 1 by load; the first two documents go to ranks 0 and 2, the third would need rank 1
(load 5) but rank 0 is then at 4; the next batch, ranks 0, 2 (both at 4), places the last two.

>>> load, tok = np.array([0.0, 5.0, 1.0]), np.zeros(3, dtype=np.int64)
>>> owner, placed = place_short(load, tok, np.ones(4, dtype=np.int64), np.array([4.0, 3.0, 3.0, 1.0]), 100)
>>> owner.tolist(), placed, load.tolist()
([0, 2, 0, 2], 4, [7.0, 5.0, 5.0])
"""

from __future__ import annotations

from typing import Tuple

import numpy as np


def place_short(load: np.ndarray, tok: np.ndarray, length: np.ndarray, cost: np.ndarray, cap: int
                ) -> Tuple[np.ndarray, int]:
    """Place documents (``length`` tokens, non-increasing; ``cost`` seconds each) one by one on
    the rank of least (load, rank) with room for them (``tok + length <= cap``), updating ``load``
    and ``tok`` in place. Returns (owner per placed document, how many were placed): it stops at
    the first document no rank has room for (the caller splits that one)."""
    n, world = len(length), len(load)
    owner = np.empty(n, dtype=np.int64)
    ranks = np.arange(world)
    pos = 0
    while pos < n:
        # Ranks without room for this document sit the batch out; a later (shorter) document that
        # one of them could hold ends the batch, as it may go there one at a time.
        room = cap - tok
        has = room >= length[pos]
        if not has.any():
            break
        full = not has.all()
        by_load = np.lexsort((ranks, load)) if not full else ranks[has][np.lexsort((ranks[has], load[has]))]
        k = min(len(by_load), n - pos)
        r, lm, u, Lm = by_load[:k], load[by_load[:k]], cost[pos:pos + k], length[pos:pos + k]
        raised = np.minimum.accumulate(lm + u)  # least load raised by documents 0..m
        ok = tok[r] + Lm <= cap
        ok[1:] &= lm[1:] < raised[:-1]
        if full:
            ok &= Lm > room[~has].max()
        k = k if ok.all() else int(np.argmin(ok))
        r = r[:k]
        load[r] += cost[pos:pos + k]
        tok[r] += length[pos:pos + k]
        owner[pos:pos + k] = r
        pos += k
    return owner[:pos], pos
