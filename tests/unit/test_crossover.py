"""cost_model.crossover_length (array-priced doubling and bisection) gives the length the scalar
search gave, bisection path included (the predicate is not monotone near the crossover: the step
compute is flat over each chunk size while the transfer grows)."""

import pytest

from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.planner.testing import toy_context
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.topology import Topology


def _scalar_crossover(cost, ring, link, share=1.0, limit=1 << 26):
    """The search as it was: one scalar cost call per probed length (transfer_s: the scalar form)."""
    if ring <= 1:
        return 0

    def hides(L):
        return cost.ring_step_compute_s(L, ring) >= cost.transfer_s(cost.kv_bytes_per_token * L / ring, link, share)
    lo, hi = 1, 2 * ring
    while not hides(hi):
        if hi >= limit:
            return limit
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if hides(mid) else (mid, hi)
    return hi


def _costs():
    yield toy_context(nodes=2, gpus=4).cost
    for cluster in ("a800", "h200"):
        prof = load_profile(cluster)
        for name in ("llama-3b", "llama-13b"):
            for tp in (1, 2):
                yield CostModel(load_model(name), prof, Topology(4, 8, prof.nics_per_node, prof.gpu_to_nic), tp)


@pytest.mark.parametrize("cost", list(_costs()), ids=lambda c: f"{c.profile.name}-{c.model.name}-tp{c.tp}")
def test_crossover_equals_the_scalar_search(cost):
    for ring in (1, 2, 3, 8):
        for link in ("nvlink", "nic"):
            for share in (1.0, 0.25):
                assert cost.crossover_length(ring, link, share) == _scalar_crossover(cost, ring, link, share)
    assert cost.crossover_length(2, "nic", limit=64) == _scalar_crossover(cost, 2, "nic", limit=64)


def test_ring_step_costs_take_arrays():
    """The array form prices each length as the scalar form does."""
    import numpy as np
    cost = toy_context(nodes=2, gpus=4).cost
    L = [1, 7, 4096, 12_345, 1 << 20]
    comp, xfer = cost.ring_step_compute_s(L, 4), cost.ring_step_transfer_s(L, 4, "nic", 0.5)
    assert comp.tolist() == [cost.ring_step_compute_s(x, 4) for x in L]
    assert xfer.tolist() == [cost.transfer_s(cost.kv_bytes_per_token * x / 4, "nic", 0.5) for x in L]
    assert isinstance(cost.ring_step_compute_s(4096, 4), float) and np.all(comp > 0)
