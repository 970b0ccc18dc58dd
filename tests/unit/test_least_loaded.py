"""partition._Ranks.least_loaded (parked full ranks, issue 54's scale goal) against a brute-force
minimum over the ranks with room, through adds and batch placements, with needs that shrink (as
the greedy asks) and that grow again (which the parking must also answer right)."""

import numpy as np
import pytest

from megatron_zeppelin.planner.partitioner.partition import _Ranks


def _brute(ranks: _Ranks, need: int):
    fits = [(ranks.load[r], r) for r in range(len(ranks.load)) if ranks.tok[r] + need <= ranks.cap]
    return min(fits) if fits else None


@pytest.mark.parametrize("seed", range(6))
def test_least_loaded_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    world, cap = int(rng.integers(1, 40)), int(rng.integers(50, 400))
    ranks = _Ranks(world, cap)
    need = cap
    for step in range(600):
        # Mostly shrinking needs (longest first), now and then a larger one.
        need = int(rng.integers(1, cap + 1)) if rng.random() < 0.1 else max(1, need - int(rng.integers(0, 3)))
        got = ranks.least_loaded(need)
        assert got == _brute(ranks, need), (seed, step, need)
        if got is not None and rng.random() < 0.8:
            ranks.add(got[1], float(rng.integers(1, 5)), need, 0.0)
        elif rng.random() < 0.5:  # a ring member elsewhere (maybe a parked rank)
            r = int(rng.integers(world))
            ranks.add(r, 0.5, int(rng.integers(0, 3)), 0.0)
        if step == 300:  # a batch placement rebuilds the heap (and must drop the parked ranks)
            n = 3
            owner = {}
            ranks.place_short(list(range(n)), np.ones(n, dtype=np.int64), np.ones(n), 0.0, owner)
    assert ranks.parked or ranks.heap  # the structure was exercised, not emptied
