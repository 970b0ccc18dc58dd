"""lpt.place_short (the greedy's short documents in numpy batches) against one document at a time
on a heap: the same owners and bit-identical loads, with ties, capacity limits and a stop."""

import heapq

import numpy as np
import pytest

from megatron_zeppelin.planner.partitioner.lpt import place_short


def one_at_a_time(load, tok, length, cost, cap):
    """The reference: each document to the rank of least (load, rank) with room, in Python floats."""
    load, tok, owner = list(map(float, load)), list(map(int, tok)), []
    for L, u in zip(length.tolist(), cost.tolist()):
        heap = [(t, r) for r, t in enumerate(load) if tok[r] + L <= cap]
        if not heap:
            break
        _, r = heapq.nsmallest(1, heap)[0]
        load[r] += u
        tok[r] += L
        owner.append(r)
    return owner, load, tok


@pytest.mark.parametrize("seed", range(40))
def test_batches_place_every_document_as_one_at_a_time(seed):
    rng = np.random.default_rng(seed)
    world = int(rng.choice([1, 2, 3, 8, 64]))
    n = int(rng.integers(0, 300))
    length = np.sort(rng.integers(1, 50, n))[::-1].copy()
    # Costs on a coarse grid give many equal loads (ties by rank); some seeds make costs non-monotone.
    cost = np.round(rng.uniform(0.5, 3.0, n) * 4) / 4 if seed % 2 else length * 0.25 + 0.1 * (length ** 2) / 50
    load0 = np.round(rng.uniform(0, 20, world) * 2) / 2 if seed % 3 else np.zeros(world)
    tok0 = rng.integers(0, 40, world)
    cap = int(rng.choice([10**9, int(tok0.max()) + 30 + int(length.sum()) // max(1, world)]))
    want_owner, want_load, want_tok = one_at_a_time(load0, tok0, length, cost, cap)
    load, tok = load0.astype(np.float64).copy(), tok0.astype(np.int64).copy()
    owner, placed = place_short(load, tok, length, cost, cap)
    assert placed == len(want_owner)
    assert owner.tolist() == want_owner
    assert load.tolist() == want_load  # bit for bit: the same additions in the same order
    assert tok.tolist() == want_tok


def test_it_stops_at_a_document_no_rank_has_room_for():
    load, tok = np.zeros(2), np.array([0, 5])
    owner, placed = place_short(load, tok, np.array([6, 6, 1]), np.array([1.0, 1.0, 1.0]), cap=10)
    assert (owner.tolist(), placed) == ([0], 1)  # 6 more tokens fit neither rank (6 and 5 held)
    assert load.tolist() == [1.0, 0.0] and tok.tolist() == [6, 5]


@pytest.mark.parametrize("seed", range(40))
def test_a_tight_cap_that_fills_ranks_early_places_as_one_at_a_time(seed):
    # A memory-capped greedy (memory_choice.memory_cap): ranks reach the cap while documents remain,
    # the ones left out of a batch and the shorter documents that still fit some of them.
    rng = np.random.default_rng(1000 + seed)
    world = int(rng.choice([2, 3, 8, 64]))
    n = int(rng.integers(50, 400))
    length = np.sort(rng.integers(1, 60, n))[::-1].copy()
    cost = length * 0.25 + np.round(rng.uniform(0, 2, n) * 4) / 4
    load0 = np.round(rng.uniform(0, 40, world) * 2) / 2
    tok0 = rng.integers(0, 80, world)
    cap = int((length.sum() + tok0.sum()) / world * rng.uniform(0.9, 1.15))
    want_owner, want_load, want_tok = one_at_a_time(load0, tok0, length, cost, cap)
    load, tok = load0.astype(np.float64).copy(), tok0.astype(np.int64).copy()
    owner, placed = place_short(load, tok, length, cost, cap)
    assert placed == len(want_owner)
    assert owner.tolist() == want_owner
    assert load.tolist() == want_load
    assert tok.tolist() == want_tok
