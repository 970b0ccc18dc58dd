"""levels.smallest_level gives the float a full bisection of the bracket ends at (the remap's time
targets and memory caps, assemble.py), whatever the estimate it starts from."""

import numpy as np
import pytest

from megatron_zeppelin.planner.build.assemble import memory_caps, node_time_targets
from megatron_zeppelin.planner.build.levels import smallest_level


def _bisect_targets(b, n_tok, rate, cap):
    """node_time_targets' level as it was computed before levels.py: 64 halvings of the bracket."""
    lo, hi = b.min(axis=1), b.max(axis=1) + rate * n_tok + rate
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        low = np.clip((mid[:, None] - b) / rate, 0.0, cap).sum(axis=1) < n_tok
        lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
    return hi


def _bisect_caps(att, a, l, capacity, balance):
    """memory_caps as it was computed before levels.py: 60 halvings of the bracket."""
    mean = (a + l) * att.sum() / att.size
    n_tok = att.sum(axis=1)

    def caps(level):
        return np.clip(np.floor((level[:, None] - a * att) / l), 0, capacity)
    lo = np.full(len(att), balance * mean)
    if (caps(lo).sum(axis=1) < n_tok).any():
        hi = lo + a * att.max() + l * (n_tok + 1)
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            short = caps(mid).sum(axis=1) < n_tok
            lo, hi = np.where(short, mid, lo), np.where(short, hi, mid)
        lo = np.where(caps(lo).sum(axis=1) < n_tok, hi, lo)
    return caps(lo).astype(np.int64).reshape(-1)


@pytest.mark.parametrize("seed", range(40))
def test_time_level_is_the_least_float_that_holds(seed):
    """By definition (fill holds there, not one float below), from any estimate; and where the old
    64 halvings converged they end at the same float (elsewhere above it, within their last width)."""
    rng = np.random.default_rng(seed)
    nodes, g = int(rng.integers(1, 9)), int(rng.choice([1, 2, 4, 8]))
    b = rng.exponential(rng.choice([1e-3, 1.0, 30.0]), (nodes, g)) * (rng.random((nodes, g)) > 0.2)
    n_tok = rng.integers(1, 200_000, nodes)
    rate = float(rng.choice([1e-7, 3e-6, 1e-4]))
    cap = np.full((nodes, g), float(rng.choice([1e9, 4096, 30_000])))
    fill = lambda T: np.clip((T[:, None] - b) / rate, 0.0, cap).sum(axis=1)  # noqa: E731
    lo, hi = b.min(axis=1), b.max(axis=1) + rate * n_tok + rate
    old = _bisect_targets(b, n_tok, rate, cap)
    for guess in (lo, hi, 0.5 * (lo + hi), old, np.nextafter(old, 0)):
        got = smallest_level(fill, n_tok, lo, hi, guess)
        holds = fill(got) >= n_tok
        assert (holds | (got == hi)).all()
        assert (fill(np.nextafter(got, -np.inf)) < n_tok)[holds].all()
        converged = fill(np.nextafter(old, -np.inf)) < n_tok
        assert (got == old)[converged].all()
        assert ((old >= got) & (old - got <= (hi - lo) * 2.0 ** -63)).all()


@pytest.mark.parametrize("seed", range(40))
def test_memory_caps_equal_the_full_bisection(seed):
    rng = np.random.default_rng(100 + seed)
    nodes, g = int(rng.integers(1, 9)), int(rng.choice([2, 4, 8]))
    att = rng.integers(0, 70_000, (nodes, g)) * (rng.random((nodes, g)) > 0.3)
    a, l = float(rng.uniform(1e3, 1e6)), float(rng.uniform(1e3, 1e6))
    capacity = int(rng.choice([16_384, 65_536, 1 << 20]))
    balance = float(rng.choice([1.0, 1.1, 1.5]))
    want = _bisect_caps(att.astype(np.float64), a, l, capacity, balance)
    got = memory_caps(att.reshape(-1).tolist(), g, a, l, capacity, balance)
    assert got.tolist() == want.tolist()


def test_time_targets_keep_node_totals():
    rng = np.random.default_rng(7)
    busy, tokens = rng.exponential(1.0, 64), rng.integers(0, 9000, 64)
    out = np.array(node_time_targets(busy.tolist(), tokens.tolist(), 8, 1e-4, 1 << 20))
    assert (out.reshape(8, 8).sum(axis=1) == tokens.reshape(8, 8).sum(axis=1)).all()


def _round_one_node_at_a_time(x, out, cap, n_tok, g):
    """node_time_targets' rounding as it was written first: node by node, the largest remainders
    (among ranks below their cap) get the +1s, or the smallest the -1s; ties to the lower rank."""
    out, frac = out.copy(), x - out
    for v in range(len(out)):
        k = int(n_tok[v] - out[v].sum())
        if k > 0:
            room = np.where(out[v] < cap[v], frac[v], -1.0)
            out[v, np.lexsort((np.arange(g), -room))[:k]] += 1
        elif k < 0:
            out[v, np.lexsort((np.arange(g), frac[v]))[:-k]] -= 1
    return out


@pytest.mark.parametrize("seed", range(60))
def test_time_targets_round_as_node_by_node(seed):
    """The rounding to node totals, all nodes at once, gives each rank what the node-by-node
    rounding gave, with ties (equal remainders, ranks at their cap) on coarse grids."""
    rng = np.random.default_rng(500 + seed)
    g, nodes = int(rng.choice([1, 2, 4, 8])), int(rng.integers(1, 6))
    busy = np.round(rng.uniform(0, 5, g * nodes), int(rng.integers(0, 3)))
    tokens = rng.integers(0, 60, g * nodes)
    cap = rng.integers(0, 80, g * nodes) if seed % 2 else np.full(g * nodes, int(rng.integers(5, 200)))
    rate = float(rng.choice([0.1, 0.25, 1.0, 0.37]))
    got = np.array(node_time_targets(busy.tolist(), tokens.tolist(), g, rate, cap)).reshape(nodes, g)
    # the same unrounded level per node, then the reference rounding
    b, c = busy.reshape(nodes, g), cap.reshape(nodes, g).astype(np.float64)
    n_tok = tokens.reshape(nodes, g).sum(axis=1)
    lo, hi = b.min(axis=1), b.max(axis=1) + rate * n_tok + rate
    level = smallest_level(lambda T: np.clip((T[:, None] - b) / rate, 0.0, c).sum(axis=1), n_tok, lo, hi, hi)
    x = np.clip((level[:, None] - b) / rate, 0.0, c)
    want = _round_one_node_at_a_time(x, np.floor(x).astype(np.int64), c, n_tok, g)
    assert got.tolist() == want.tolist()
