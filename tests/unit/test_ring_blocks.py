"""program.ring_blocks (every ring block as arrays, from a per-size grid built once) against
ring_step_blocks (the blocks of one member at one step, enumerated by hand), block by block and in
order; and assembly's prepare with the partitioner's local documents handed over equal to it
deriving them."""

from dataclasses import replace

import numpy as np
import pytest

from megatron_zeppelin.planner.build.assemble import prepare
from megatron_zeppelin.planner.build.layout import zigzag_bounds
from megatron_zeppelin.planner.program import ring_blocks, ring_step_blocks
from megatron_zeppelin.planner.testing import toy_context
from megatron_zeppelin.planner.types import DocPlan, Ring


def _rings(rng):
    rings, docs, d = [], {}, 0
    for r in range(int(rng.integers(1, 6))):
        G = int(rng.choice([1, 2, 3, 4, 5, 8]))
        ids = []
        for _ in range(int(rng.integers(0, 4))):
            L = int(rng.integers(1, 40))  # short documents: empty chunks where L < 2G
            docs[d] = DocPlan(d, L, "intra", r, -1, zigzag_bounds(L, G))
            ids.append(d)
            d += 1
        rings.append(Ring(r, tuple(int(x) for x in rng.permutation(16)[:G]), "intra", tuple(ids)))
    return rings, docs


@pytest.mark.parametrize("seed", range(40))
def test_ring_blocks_are_the_step_blocks_in_order(seed):
    rings, docs = _rings(np.random.default_rng(seed))
    b = ring_blocks(rings, docs)
    want = [(ri, s, i, blk) for ri, r in enumerate(rings) for s in range(r.size) for i in range(r.size)
            for blk in ring_step_blocks(r, docs, i, s)]
    got = list(zip(b.ring.tolist(), b.step.tolist(), b.member.tolist(),
                   zip(b.q.astype(int).tolist(), b.kv.astype(int).tolist(), b.causal.tolist())))
    assert got == want
    assert b.rank.tolist() == [rings[ri].ranks[i] for ri, _, i, _ in want]
    # one sequence id per (ring, document, query chunk): blocks of one query chunk share it
    assert len(set(b.seq.tolist())) <= sum(2 * r.size * len(r.docs) for r in rings)


def test_prepare_with_the_partitioners_local_documents():
    from megatron_zeppelin.planner.partitioner.partition import _choose, _placement
    ctx = toy_context(nodes=2, gpus=4)
    lengths = [9000, 5000, 1200, 800, 700, 300, 200, 100, 90, 60, 40, 30]
    pl = _placement(lengths, ctx, *_choose(lengths, ctx, "all", "hide")[0])
    assert pl.local == [d for d in pl.docs if d.cls == "local"] and pl.local  # in document order
    with_local, derived = prepare(ctx, pl), prepare(ctx, replace(pl, local=None))
    assert with_local == derived
