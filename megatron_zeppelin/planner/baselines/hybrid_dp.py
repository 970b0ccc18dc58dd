"""hybrid_dp: ByteScale-style Hybrid Data Parallelism (short documents DP, long ones CP, by FLOPs).

ByteScale (arXiv 2502.21231) shards a sequence only as far as it must and balances compute, not
tokens. Here, with W ranks and the balanced share B = total FLOPs / W (attention fwd+bwd FLOPs, causal,
plus linear fwd+bwd FLOPs of every document):

1. data-aware sharding: documents in decreasing length (ties by index); each starts from the smallest
   power-of-two CP group size g dividing W (or W itself) whose zigzag share fits the per-rank
   capacity and whose per-rank FLOPs (FLOPs / g) fit B (the largest size that fits the capacity if
   none reaches B); g = 1 means plain DP (local);
1b. balancing (ByteScale's balance scheduler, within one global batch): a split document takes,
   from that size up, the smallest size whose best block below stays within B counting the FLOPs
   its ranks already hold; if none does, the size and block of least resulting peak
   (_balanced_block). Documents kept whole stay whole (step 3 balances them);
2. topology-aware grouping: a CP group is a block of g consecutive ranks aligned to g, so groups of
   up to gpus_per_node ranks are packed inside one node first; among the blocks with room the one
   whose busiest member has the fewest FLOPs so far (ties: lowest rank) takes the document;
3. a local document goes to the rank with the fewest FLOPs so far (ties: lowest rank) with room.

A document that finds no room at its size tries the next size up. Documents on the same group share
one p2p ring. No routing, no remap (ByteScale has neither Zeppelin layer).

Example: 4 ranks (toy model). FLOPs of the lengths 2000, 1500, 1200, 1000 are about 4.67, 2.83,
1.94, 1.44 GFLOP, so the share is 2.72: the two longest need groups of 2 (2000 on ranks 0-1, then 1500
on the idle block 2-3), 1200 goes to the least loaded rank 2 (1.42), and 1000 to rank 3.

>>> from megatron_zeppelin.planner.testing import toy_context
>>> p = plan_hybrid_dp([2000, 1500, 1200, 1000], toy_context(gpus=4))
>>> [(r.ranks, r.docs) for r in p.rings], [(d.doc, d.owner) for d in p.docs if d.cls == "local"]
([((0, 1), (0,)), ((2, 3), (1,))], [(2, 2), (3, 3)])
"""

from __future__ import annotations

from typing import Dict, Sequence, Tuple

from megatron_zeppelin.planner.context import Placement, PlanContext
from megatron_zeppelin.planner.strategies import strategy
from megatron_zeppelin.planner.cost.cost_model import BWD_FLOPS, LINEAR_PASSES, CostModel
from megatron_zeppelin.planner.types import PlanError
from megatron_zeppelin.planner.baselines.cp_groups import aligned_blocks, member_tokens, placement_from_groups, cp_sizes
from megatron_zeppelin.spec.words import Comm, StrategyName


def doc_flops(length: int, cost: CostModel) -> float:
    """Iteration FLOPs of one document on one TP rank: causal attention fwd+bwd and linear fwd+bwd."""
    m = cost.model
    attn = cost.block_flops(length, length, causal=True) * (1.0 + BWD_FLOPS) * m.layers
    lin = length * (m.layers * m.linear_flops_per_token(cost.tp) + m.head_flops_per_token(cost.tp))
    return attn + LINEAR_PASSES * lin


@strategy(StrategyName.HYBRID_DP, order=4)
def plan_hybrid_dp(lengths: Sequence[int], ctx: PlanContext) -> Placement:
    world, cap = ctx.topology.world_size, ctx.capacity
    sizes = cp_sizes(world)
    flops = [doc_flops(L, ctx.cost) for L in lengths]
    share = sum(flops) / world
    load = [0.0] * world
    tok = [0] * world
    groups: Dict[int, Tuple[int, ...]] = {}
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        L = lengths[i]
        fits = [g for g in sizes if max(member_tokens(L, g)) <= cap]
        if not fits:
            raise PlanError(f"hybrid_dp: document {i} ({L} tokens) fits no CP group size of the "
                            f"{world} ranks at capacity {cap}: raise --zeppelin-capacity-tokens")
        first = next((k for k, g in enumerate(fits) if flops[i] / g <= share), len(fits) - 1)
        # A document the data-aware step keeps whole stays whole (LPT below); split ones may widen.
        up = fits[first:]
        block = (_balanced_block(L, flops[i], up, world, load, tok, cap, share) if up[0] > 1
                 else next((b for g in up for b in [_best_block(L, g, world, load, tok, cap)] if b), None))
        if block is None:
            raise PlanError(f"hybrid_dp: no group has room for document {i} ({L} tokens) at capacity "
                            f"{cap}: raise --zeppelin-capacity-tokens")
        groups[i] = block
        for r, t in zip(block, member_tokens(L, len(block))):
            load[r] += flops[i] / len(block)
            tok[r] += t
    why = ("ByteScale-style HDP: each document on the smallest power-of-two group that fits the capacity "
           f"and the balanced FLOPs share ({share:.3g} FLOPs/rank); groups aligned inside nodes first")
    return placement_from_groups(lengths, groups, ctx, Comm.P2P, why, {"flops_share": f"{share:.6g}"})


def _balanced_block(L: int, f: float, sizes, world: int, load, tok, cap, share: float):
    """ByteScale's balance step: the smallest size (from the data-aware one up) whose best block
    stays within the balanced share *with the load it already holds*; if none does, the size and
    block of least resulting peak (ties: the smaller size). A document is thus not stacked onto
    ranks already busy with parts of a longer one when a wider group would even them out."""
    best = None
    for g in sizes:
        block = _best_block(L, g, world, load, tok, cap)
        if block is None:
            continue
        peak = max([load[r] for r in block]) + f / g
        if peak <= share:
            return block
        if best is None or peak < best[0]:
            best = (peak, block)
    return None if best is None else best[1]


def _best_block(L: int, g: int, world: int, load, tok, cap):
    """The aligned block of g ranks with room whose busiest member has the least load (ties: lowest)."""
    shares = member_tokens(L, g)
    best = None
    for block in aligned_blocks(g, world):
        if any(tok[r] + t > cap for r, t in zip(block, shares)):
            continue
        key = (max([load[r] for r in block]), block[0])
        if best is None or key < best[0]:
            best = (key, block)
    return None if best is None else best[1]
