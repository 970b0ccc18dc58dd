"""Per-node fill levels: the smallest level at which a monotone fill of a node's ranks holds its tokens.

The remap's time targets (assemble.node_time_targets) and memory caps (assemble.memory_caps) each
ask, per node, for the smallest level T in (lo, hi] with fill(T) >= need, where fill is monotone
non-decreasing in T (a sum over the node's ranks of clip((T - base) / rate, 0, cap), floored or not).
A bisection of the whole bracket finds it to the float (its last two floats are adjacent, and the
larger is the answer), but takes ~60 rounds of small array operations, which were a tenth of the time
to plan 1k documents. ``smallest_level`` gives the same float from a close estimate
(``linear_level``, the unfloored fill solved exactly): it gallops out from the estimate by ulps until
it brackets the answer, then bisects that bracket. The answer does not depend on the estimate (fill
is monotone, so the smallest such float is unique); a poor estimate only costs rounds.

>>> import numpy as np
>>> base, cap = np.array([[0.0, 2.0]]), np.array([[10.0, 10.0]])
>>> float(linear_level(base, 1.0, cap, np.array([4.0]))[0])   # (3 - 0) + (3 - 2) = 4
3.0
>>> fill = lambda T: np.floor(T)        # one node: fill(T) >= 3 from T = 3.0
>>> float(smallest_level(fill, np.array([3.0]), np.array([0.0]), np.array([10.0]), np.array([2.9]))[0])
3.0
"""

from __future__ import annotations

from typing import Callable

import numpy as np

GALLOP = 64  # most doublings of the step away from the estimate (past them: the original bracket)


def linear_level(base: np.ndarray, rate: float, cap: np.ndarray, need: np.ndarray) -> np.ndarray:
    """Per node (rows) the level T with sum(clip((T - base) / rate, 0, cap)) = need, solved on its
    breakpoints (piecewise linear); the largest breakpoint where even that falls short."""
    pts = np.sort(np.concatenate([base, base + rate * cap], axis=1), axis=1)  # [nodes, 2g]
    got = np.clip((pts[:, :, None] - base[:, None, :]) / rate, 0.0, cap[:, None, :]).sum(axis=2)
    j = np.minimum((got < need[:, None]).sum(axis=1), pts.shape[1] - 1)  # first breakpoint that holds
    rows = np.arange(len(pts))
    p1, g1 = pts[rows, j], got[rows, j]
    p0, g0 = pts[rows, np.maximum(j - 1, 0)], got[rows, np.maximum(j - 1, 0)]
    slope = np.where(g1 > g0, (p1 - p0) / np.where(g1 > g0, g1 - g0, 1.0), 0.0)
    return np.where(j > 0, p0 + (need - g0) * slope, p1)


def smallest_level(fill: Callable[[np.ndarray], np.ndarray], need: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                   guess: np.ndarray) -> np.ndarray:
    """Per node the smallest float T in (lo, hi] with fill(T) >= need, or ``hi`` when fill(hi) < need,
    as a converged bisection of (lo, hi] ends; ``fill`` maps levels [nodes] to fills [nodes]."""
    lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    g = np.clip(np.asarray(guess, dtype=np.float64), lo, hi)
    below = fill(g) >= need  # the answer is at or below the guess
    a, b = np.where(below, lo, g), np.where(below, g, hi)  # fill(a) < need <= fill(b), but at lo / hi
    step = np.maximum(np.spacing(np.abs(g)), np.finfo(np.float64).tiny)
    done = np.zeros(len(g), dtype=bool)
    for _ in range(GALLOP):
        probe = np.clip(np.where(below, g - step, g + step), lo, hi)
        ok, live = fill(probe) >= need, ~done
        a = np.where(live & ~ok, probe, a)  # a probe that falls short bounds from below
        b = np.where(live & ok, probe, b)  # one that holds, from above
        done |= np.where(below, ~ok, ok) | (probe <= lo) | (probe >= hi)
        if done.all():
            break
        step = step * 2
    while True:  # bisect (a, b] until a and b are adjacent floats
        mid = 0.5 * (a + b)
        inside = (mid > a) & (mid < b)
        if not inside.any():
            return b
        low = fill(mid) < need
        a, b = np.where(inside & low, mid, a), np.where(inside & ~low, mid, b)
