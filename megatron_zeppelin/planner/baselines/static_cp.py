"""static_cp: Transformer Engine-style context parallelism over a fixed CP group size.

As Megatron lays it out: CP groups are blocks of ``cp`` consecutive ranks (CP <= gpus_per_node stays
inside a node), DP = world / cp groups; documents are packed over the DP groups token-balanced
(longest first to the group with the fewest tokens, ties by group index), and every document of a
group is zigzag-split over all its ranks (TE DualChunkSwap: member i holds chunks i and 2cp-1-i) and
run as one p2p ring. A CP group of one rank keeps its documents local (plain packed DP).

The comm type is a run-level setting too, as Transformer Engine's ``cp_comm_type``: ``p2p`` (the
zigzag ring) or ``a2a`` (DeepSpeed-Ulysses: transformer_engine/pytorch/attention/
dot_product_attention/context_parallel.py, AttnFuncWithCPAndQKVOA2A: an all-to-all turns the
sequence-sharded Q/K/V into head-sharded ones, each rank attends the whole sequence for its heads,
and an all-to-all brings the output back; THD input with the same DualChunkSwap chunks). TE asserts
``num_heads % cp_size == 0`` for Q and for K/V (it does not replicate K/V heads), so a2a is offered
only for CP sizes dividing the Q and the K/V heads of one TP rank; other sizes are skipped, with why.

Hierarchical ``a2a+p2p`` (TE's AttnFuncWithCPAndKVP2P with ``cp_group = [a2a group, p2p group]``,
THD since TE release_v2.19, PR #3290; Megatron-LM's ``--cp-comm-type a2a+p2p
--hierarchical-context-parallel-sizes a p``, megatron/core/parallel_state.py
create_hierarchical_groups): a CP group of cp = a x p ranks runs an all-to-all over heads inside
each block of ``a`` consecutive ranks and a zigzag ring over the p blocks. The split is a run-level
setting too: ``a`` must divide gpus_per_node (an a2a group inside one node, on NVLink, as Megatron
lays the level-0 groups out of consecutive ranks) and the Q and K/V heads of one TP rank (TE splits
them over the a2a group), with 2 <= a < cp (a = cp is a2a, a = 1 p2p, as TE falls back);
``--zeppelin-cp-a2a-size`` (``config.cp_a2a_size``) fixes it. Those predictions are in
``meta['a2a_p2p_predicted_s']`` by ``AxP`` (Megatron's two sizes), the winner's split in
``meta['hierarchical_cp_sizes']``.

``--zeppelin-cp-size`` (``config.cp_size``) fixes the CP size; 0 tries every power of two dividing
the domain (and the whole domain). ``--zeppelin-cp-comm-type`` (``config.cp_comm``) fixes the comm
type; auto tries all three. Every (CP size, comm type) is a candidate and the
predicted-fastest is kept (``meta['cp_size']``, the rings' ``comm``; the p2p candidates' predictions
are in ``meta['cp_size_predicted_s']``, the a2a ones' in ``meta['a2a_cp_size_predicted_s']``).
Routing and remap are off: stock Megatron has neither.

Every document is padded to a multiple of 2 x cp, as TE's THD CP needs (planner/build/padding.py
names the sources): packing, capacity and price count the pad rows, the engine runs the real rows.

Example: 4 ranks, CP 2: groups (0, 1) and (2, 3); lengths 8, 6, 4, padded to 8, 8, 4, pack as
{8, 4} and {6}.

>>> from megatron_zeppelin.planner.testing import toy_context
>>> p = cp_placement([8, 6, 4], toy_context(gpus=4), cp=2, comm="p2p")
>>> [(r.ranks, r.cls, r.docs) for r in p.rings], [d.padded for d in p.docs]
([((0, 1), 'intra', (0, 2)), ((2, 3), 'intra', (1,))], [0, 8, 0])
>>> p.docs[0].bounds   # 8 tokens in 2*2 zigzag chunks
(0, 2, 4, 6, 8)
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Iterable, Sequence

from megatron_zeppelin.planner.context import Placement, PlanContext
from megatron_zeppelin.planner.strategies import Candidate, strategy
from megatron_zeppelin.planner.types import PlanError
from megatron_zeppelin.planner.build.padding import cp_pad_multiple, held_capacity, pad_to
from megatron_zeppelin.planner.baselines.cp_groups import aligned_blocks, cp_sizes, placement_from_groups, rank_tokens, setting_candidates
from megatron_zeppelin.spec.words import Comm, StrategyName


def cp_placement(lengths: Sequence[int], ctx: PlanContext, cp: int, comm: str, a2a: int = 1,
                 pad: bool = True) -> Placement:
    """Every document over its CP group of ``cp`` consecutive ranks; groups packed by tokens;
    ``a2a``: the a2a group size of an a2a+p2p run. ``pad``: each document padded to a multiple of
    2 x cp (x TP with sequence parallelism) as TE's THD CP needs (planner/build/padding.py, its
    sources): the packing, the capacity check and the price count the padded tokens, the engine runs
    the real ones. Zeppelin's shapes (portfolio/shapes.py) run on its own engine: pad=False.

    >>> from megatron_zeppelin.planner.testing import toy_context   # 13 pads to 16: 8 tokens a rank
    >>> from megatron_zeppelin.spec.config import ZeppelinConfig
    >>> cfg = ZeppelinConfig(gpus_per_node=2, capacity_tokens=7)
    >>> cp_placement([13], toy_context(gpus=2, capacity=7, config=cfg), cp=2, comm="p2p")
    Traceback (most recent call last):
    ...
    megatron_zeppelin.planner.errors.PlanError: CP size 2: rank 0 would hold 8 tokens (with TE's padding to a multiple of 4) > capacity 7 (raise --zeppelin-capacity-tokens or --zeppelin-cp-size)
    """
    world = ctx.topology.world_size
    if cp < 1 or world % cp:
        raise PlanError(f"CP size {cp} does not divide the domain of {world} ranks "
                        f"(set --zeppelin-cp-size to a power of two dividing {world}, or 0 for auto)")
    if comm == Comm.A2A and cp > 1:
        heads_error(ctx, cp)
    if comm == Comm.A2A_P2P:
        why = hier_problem(ctx, cp, a2a)
        if why:
            raise PlanError(why)
    blocks = aligned_blocks(cp, world)
    multiple = cp_pad_multiple(cp, ctx.cost.tp, ctx.cost.sp) if pad else 1
    held = [pad_to(L, multiple) for L in lengths] if multiple > 1 else lengths  # what is packed and held
    groups = {i: blocks[k] for i, k in enumerate(cp_assignment(held, len(blocks)))}
    tok = rank_tokens(held, groups, world)
    worst = max(range(world), key=lambda r: (tok[r], -r))
    cap = held_capacity(ctx, held) if multiple > 1 else ctx.capacity
    if tok[worst] > cap:
        padding = f" (with TE's padding to a multiple of {multiple})" if multiple > 1 else ""
        raise PlanError(f"CP size {cp}: rank {worst} would hold {tok[worst]} tokens{padding} > capacity {cap} "
                        f"(raise --zeppelin-capacity-tokens or --zeppelin-cp-size)")
    kind = {Comm.P2P: "TE p2p", Comm.A2A: "TE a2a (Ulysses)", Comm.ALLGATHER: "Llama-3 all-gather",
            Comm.A2A_P2P: f"TE a2a+p2p ({a2a} x {cp // max(a2a, 1)})"}[Comm(comm)]
    why = (f"{kind} CP over fixed groups of {cp} consecutive "
           f"rank(s): every document split over its group" if cp > 1 else "CP size 1: packed DP, all local")
    meta = {"cp_size": str(cp), "dp_size": str(world // cp)}
    if comm == Comm.A2A_P2P:
        meta["hierarchical_cp_sizes"] = f"{a2a} {cp // a2a}"
    if multiple > 1:
        meta["pad_multiple"] = str(multiple)
    pl = placement_from_groups(lengths, groups, ctx, comm, why, meta, held if multiple > 1 else None)
    if comm == Comm.A2A_P2P:
        pl.rings = [replace(r, a2a=a2a) for r in pl.rings]
    return pl


def hier_problem(ctx: PlanContext, cp: int, a: int) -> str:
    """Why TE's a2a+p2p cannot run a CP group of ``cp`` in a2a groups of ``a`` ('' when it can).

    >>> from megatron_zeppelin.planner.testing import toy_context   # 4 heads, 2 K/V heads, 4 GPUs a node
    >>> hier_problem(toy_context(nodes=2, gpus=4), 8, 2), hier_problem(toy_context(nodes=2, gpus=4), 4, 2)
    ('', '')
    >>> hier_problem(toy_context(nodes=2, gpus=4), 8, 4)
    'a2a+p2p a2a group of 4 does not divide the 2 K/V heads of a TP rank (TE splits Q and K/V heads over it: set --zeppelin-cp-a2a-size to one dividing both)'
    """
    return a2a_p2p_problem(ctx.cost.model, ctx.cost.tp, ctx.topology.gpus_per_node, cp, a)


def a2a_p2p_problem(model, tp: int, gpus_per_node: int, cp: int, a: int) -> str:
    """hier_problem for ``model`` at TP ``tp`` on nodes of ``gpus_per_node`` (sim/runs.py's settings)."""
    if a < 2 or a >= cp or cp % a:
        return (f"a2a+p2p needs an a2a group size 2 <= a < {cp} dividing the CP size {cp}, got {a} "
                f"(set --zeppelin-cp-a2a-size, or --zeppelin-cp-comm-type p2p / a2a)")
    if gpus_per_node % a:
        return (f"a2a+p2p a2a group of {a} does not divide the {gpus_per_node} GPUs of a node (its all-to-all "
                f"runs inside a node: set --zeppelin-cp-a2a-size to a divisor of {gpus_per_node})")
    why = a2a_heads_problem(model, tp, a)
    return why.replace(f"a2a CP size {a}", f"a2a+p2p a2a group of {a}").replace(
        "(TE needs num_heads % cp_size == 0 for Q and K/V: use p2p or a CP size dividing both)",
        "(TE splits Q and K/V heads over it: set --zeppelin-cp-a2a-size to one dividing both)") if why else ""


def hier_splits(ctx: PlanContext, cp: int) -> list:
    """The a2a group sizes an a2a+p2p CP group of ``cp`` may take: ``config.cp_a2a_size`` if set,
    else every divisor a of cp with 2 <= a < cp (hier_problem then refuses those that cannot run)."""
    if ctx.config.cp_a2a_size:
        return [ctx.config.cp_a2a_size]
    return [a for a in range(2, cp) if cp % a == 0]


def heads_error(ctx: PlanContext, cp: int) -> None:
    """Raise PlanError where an a2a CP group of ``cp`` cannot split the heads of one TP rank (TE's
    assert: num_heads % cp_size == 0 for Q and for K/V).

    >>> from megatron_zeppelin.planner.testing import toy_context   # 4 heads, 2 K/V heads
    >>> heads_error(toy_context(gpus=4), 2)
    >>> heads_error(toy_context(gpus=4), 4)
    Traceback (most recent call last):
    ...
    megatron_zeppelin.planner.errors.PlanError: a2a CP size 4 does not divide the 2 K/V heads of a TP rank (TE needs num_heads % cp_size == 0 for Q and K/V: use p2p or a CP size dividing both)
    """
    why = a2a_heads_problem(ctx.cost.model, ctx.cost.tp, cp)
    if why:
        raise PlanError(why)


def a2a_heads_problem(model, tp: int, cp: int) -> str:
    """Why TE's a2a cannot run at CP size ``cp`` with ``model`` at TP ``tp`` ('' when it can)."""
    for what, n in (("Q", max(1, model.heads // tp)), ("K/V", max(1, model.kv_heads // tp))):
        if n % cp:
            return (f"a2a CP size {cp} does not divide the {n} {what} heads of a TP rank (TE needs "
                    f"num_heads % cp_size == 0 for Q and K/V: use p2p or a CP size dividing both)")
    return ""


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


def a2a_candidates(lengths: Sequence[int], ctx: PlanContext) -> Iterable[Candidate]:
    """The a2a (Ulysses) settings: ``config.cp_size`` if set, else every CP size (size 1, packed DP,
    only where p2p does not offer it already); one whose size does not divide the heads carries
    that error (choose skips it)."""
    sizes = [ctx.config.cp_size] if ctx.config.cp_size else cp_sizes(ctx.topology.world_size)
    low = 1 if Comm.P2P not in cp_comms(ctx) else 2
    return setting_candidates([(cp, (lambda cp=cp: cp_placement(lengths, ctx, cp, Comm.A2A)))
                               for cp in sizes if cp >= low], "a2a_cp_size")


def a2a_p2p_candidates(lengths: Sequence[int], ctx: PlanContext) -> Iterable[Candidate]:
    """The a2a+p2p settings: every (CP size, a2a group size) with a ring of at least two groups
    (``config.cp_size`` / ``config.cp_a2a_size`` fix either), labelled ``AxP``; one that cannot
    run carries why (choose skips it)."""
    sizes = [ctx.config.cp_size] if ctx.config.cp_size else cp_sizes(ctx.topology.world_size)
    splits = [(cp, a) for cp in sizes for a in hier_splits(ctx, cp)]
    if not splits:  # no CP size of 4 or more: TE would fall back to a2a or p2p; say so
        return iter([Candidate(None, setting=("a2a_p2p", "none"), error=PlanError(
            f"a2a+p2p needs a CP group of at least 4 ranks (a2a groups of >= 2, a ring of >= 2 groups); CP sizes "
            f"here: {sizes} (set --zeppelin-cp-comm-type p2p or a2a, or --zeppelin-cp-size)"))])
    return setting_candidates([(f"{a}x{cp // a}", (lambda cp=cp, a=a: cp_placement(lengths, ctx, cp, Comm.A2A_P2P, a)))
                               for cp, a in splits], "a2a_p2p")


def cp_comms(ctx: PlanContext) -> tuple:
    """The comm types static_cp may run: ``--zeppelin-cp-comm-type`` (``config.cp_comm``), or all."""
    return (Comm.P2P, Comm.A2A, Comm.A2A_P2P) if ctx.config.cp_comm is None else (ctx.config.cp_comm,)


@strategy(StrategyName.STATIC_CP, order=2, searches=True)
def plan_static_cp(lengths: Sequence[int], ctx: PlanContext, search=None) -> Iterable[Candidate]:
    comms = cp_comms(ctx)
    if Comm.P2P in comms:
        yield from cp_candidates(lengths, ctx, Comm.P2P)
    if Comm.A2A in comms:
        yield from a2a_candidates(lengths, ctx)
    if Comm.A2A_P2P in comms:
        yield from a2a_p2p_candidates(lengths, ctx)
