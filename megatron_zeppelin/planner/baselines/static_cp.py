"""static_cp: Transformer Engine-style context parallelism over a fixed CP group size.

As Megatron lays it out: CP groups are blocks of ``cp`` consecutive ranks (CP <= gpus_per_node stays
inside a node), DP = world / cp groups; documents are packed over the DP groups token-balanced
(longest first to the group with the fewest tokens, ties by group index), and every document of a
group is zigzag-split over all its ranks (TE DualChunkSwap: member i holds chunks i and 2cp-1-i) and
run as one p2p ring. A CP group of one rank keeps its documents local (plain packed DP).

``--zeppelin-cp-size`` (``config.cp_size``) fixes the CP size; 0 tries every power of two dividing
the domain (and the whole domain) and keeps the predicted-fastest (``meta['cp_size']``; every
candidate's prediction is in ``meta['cp_size_predicted_s']``). Routing and remap are off: stock Megatron has neither.

Example: 4 ranks, CP 2: groups (0, 1) and (2, 3); lengths 8, 6, 4 pack as {8} and {6, 4}.

>>> from megatron_zeppelin.planner.testing import toy_context
>>> p = cp_placement([8, 6, 4], toy_context(gpus=4), cp=2, comm="p2p")
>>> [(r.ranks, r.cls, r.docs) for r in p.rings]
[((0, 1), 'intra', (0,)), ((2, 3), 'intra', (1, 2))]
>>> p.docs[0].bounds   # 8 tokens in 2*2 zigzag chunks
(0, 2, 4, 6, 8)
"""

from __future__ import annotations

import heapq
from typing import Iterable, Sequence

from megatron_zeppelin.planner.context import Placement, PlanContext
from megatron_zeppelin.planner.strategies import Candidate, strategy
from megatron_zeppelin.planner.types import PlanError
from megatron_zeppelin.planner.baselines.cp_groups import aligned_blocks, cp_sizes, placement_from_groups, rank_tokens, setting_candidates
from megatron_zeppelin.spec.words import Comm, StrategyName


def cp_placement(lengths: Sequence[int], ctx: PlanContext, cp: int, comm: str) -> Placement:
    """Every document over its CP group of ``cp`` consecutive ranks; groups packed by tokens."""
    world = ctx.topology.world_size
    if cp < 1 or world % cp:
        raise PlanError(f"CP size {cp} does not divide the domain of {world} ranks "
                        f"(set --zeppelin-cp-size to a power of two dividing {world}, or 0 for auto)")
    blocks = aligned_blocks(cp, world)
    groups = {i: blocks[k] for i, k in enumerate(cp_assignment(lengths, len(blocks)))}
    tok = rank_tokens(lengths, groups, world)
    worst = max(range(world), key=lambda r: (tok[r], -r))
    if tok[worst] > ctx.capacity:
        raise PlanError(f"CP size {cp}: rank {worst} would hold {tok[worst]} tokens > capacity {ctx.capacity} "
                        f"(raise --zeppelin-capacity-tokens or --zeppelin-cp-size)")
    why = (f"{'TE p2p' if comm == 'p2p' else 'Llama-3 all-gather'} CP over fixed groups of {cp} consecutive "
           f"rank(s): every document split over its group" if cp > 1 else "CP size 1: packed DP, all local")
    return placement_from_groups(lengths, groups, ctx, comm, why, {"cp_size": str(cp), "dp_size": str(world // cp)})


def cp_assignment(lengths: Sequence[int], groups: int) -> list:
    """Per document, the index of its CP group: longest first to the group with the fewest tokens
    (ties: the lower group), as Megatron's packing does.

    >>> cp_assignment([8, 6, 4], 2)
    [0, 1, 1]
    """
    heap = [(0, k) for k in range(groups)]
    out = [0] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        tok, k = heapq.heappop(heap)
        out[i] = k
        heapq.heappush(heap, (tok + lengths[i], k))
    return out


def cp_candidates(lengths: Sequence[int], ctx: PlanContext, comm: str) -> Iterable[Candidate]:
    """``config.cp_size`` if set, else one candidate per CP size (see cp_sizes), ascending; the
    one place that picks (strategies.choose) keeps the predicted-fastest."""
    if ctx.config.cp_size:
        return (Candidate(cp_placement(lengths, ctx, ctx.config.cp_size, comm)),)
    return setting_candidates([(cp, (lambda cp=cp: cp_placement(lengths, ctx, cp, comm)))
                               for cp in cp_sizes(ctx.topology.world_size)], "cp_size")


@strategy(StrategyName.STATIC_CP, order=2, searches=True)
def plan_static_cp(lengths: Sequence[int], ctx: PlanContext, search=None) -> Iterable[Candidate]:
    return cp_candidates(lengths, ctx, Comm.P2P)
