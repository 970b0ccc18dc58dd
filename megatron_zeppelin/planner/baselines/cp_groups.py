"""Shared pieces of the CP baselines: aligned groups of consecutive ranks, exact zigzag shares,
turning a doc -> group assignment into a Placement, and picking the predicted-fastest candidate.

Groups are blocks of consecutive ranks aligned to their size (as Megatron lays out CP groups), so a
group of at most ``gpus_per_node`` ranks stays inside one node:

>>> from megatron_zeppelin.spec.topology import Topology
>>> aligned_blocks(2, 8)
[(0, 1), (2, 3), (4, 5), (6, 7)]
>>> ring_class((0, 1, 2, 3), Topology(2, 4)), ring_class((0, 1, 2, 3, 4, 5, 6, 7), Topology(2, 4))
('intra', 'inter')
>>> member_tokens(10, 2)   # zigzag bounds (0, 2, 5, 7, 10): member 0 holds 2+3, member 1 holds 3+2
(5, 5)

A doc -> group map becomes local documents (group of one) and one ring per distinct group:

>>> from megatron_zeppelin.planner.testing import toy_context
>>> p = placement_from_groups([8, 3, 6], {0: (0, 1), 1: (1,), 2: (0, 1)}, toy_context(gpus=2), "p2p")
>>> [(r.ranks, r.cls, r.docs) for r in p.rings], [(d.doc, d.cls, d.owner) for d in p.docs]
([((0, 1), 'intra', (0, 2))], [(0, 'intra', -1), (1, 'local', 1), (2, 'intra', -1)])
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from megatron_zeppelin.planner.context import Placement, PlanContext
from megatron_zeppelin.planner.build.layout import zigzag_bounds
from megatron_zeppelin.planner.strategies import Candidate
from megatron_zeppelin.planner.types import DocPlan, PlanError, Ring, Thresholds
from megatron_zeppelin.spec.words import DocClass


def aligned_blocks(size: int, world: int) -> List[Tuple[int, ...]]:
    """Every block of ``size`` consecutive ranks starting at a multiple of ``size``."""
    return [tuple(range(a, a + size)) for a in range(0, world - size + 1, size)]


def cp_sizes(world: int) -> List[int]:
    """CP group sizes: the powers of two that divide ``world``, and the whole domain (so a domain of
    3 nodes x 4 GPUs can still split a document over all 12 ranks, as Megatron allows), ascending.

    >>> cp_sizes(8), cp_sizes(12)
    ([1, 2, 4, 8], [1, 2, 4, 12])
    """
    out, g = [], 1
    while g <= world:
        if world % g == 0:
            out.append(g)
        g *= 2
    return out if out[-1] == world else out + [world]


def ring_class(ranks: Sequence[int], topo) -> str:
    # a node's ranks are consecutive (topology.node_of), so the lowest and highest rank tell
    return DocClass.INTRA if topo.same_node(min(ranks), max(ranks)) else DocClass.INTER


@lru_cache(maxsize=1 << 16)  # pure: every CP shape of a batch (and its bound) asks for the same (length, g)
def member_tokens(length: int, g: int) -> Tuple[int, ...]:
    """Exact tokens each of ``g`` zigzag members holds (chunks i and 2g-1-i, no padding)."""
    if g == 1:
        return (length,)
    b = zigzag_bounds(length, g)
    return tuple([b[i + 1] - b[i] + b[2 * g - i] - b[2 * g - 1 - i] for i in range(g)])


def placement_from_groups(lengths: Sequence[int], groups: Mapping[int, Tuple[int, ...]], ctx: PlanContext,
                          comm: str, why: str = "", meta: Dict[str, str] = None,
                          padded: Optional[Sequence[int]] = None) -> Placement:
    """One ring per distinct rank tuple (its documents in index order); groups of one are local.
    ``why`` explains the classes in the plan's thresholds. ``padded``: per document, the length the
    real system pads it to (DocPlan.padded: charged, not run; planner/build/padding.py), or None."""
    topo = ctx.topology
    ring_keys = sorted({g for g in groups.values() if len(g) > 1}, key=lambda g: (-len(g), g))
    ring_id = {g: i for i, g in enumerate(ring_keys)}
    cls = {g: ring_class(g, topo) for g in ring_keys}  # once per ring, not per document (16k of them)
    members: Dict[Tuple[int, ...], List[int]] = {g: [] for g in ring_keys}
    docs = []
    for i, L in enumerate(lengths):
        g = tuple(groups[i])
        pad = int(padded[i]) if padded is not None and padded[i] != L else 0
        if len(g) == 1:
            docs.append(DocPlan(i, int(L), DocClass.LOCAL, -1, g[0], (0, int(L)), pad))
        else:
            members[g].append(i)
            docs.append(DocPlan(i, int(L), cls[g], ring_id[g], -1, zigzag_bounds(int(L), len(g)), pad))
    rings = [Ring(ring_id[g], g, cls[g], tuple(members[g]), comm) for g in ring_keys]
    return Placement(docs=docs, rings=rings, thresholds=describe_thresholds(docs, why), meta=dict(meta or {}),
                     padded=any(d.padded for d in docs))


def describe_thresholds(docs: Sequence[DocPlan], why: str) -> Thresholds:
    """The classes a baseline actually produced: longest local document, longest non-inter one."""
    is_local, inter = DocClass.LOCAL, DocClass.INTER  # bound once per call (spec/words.py)
    local = max((d.length for d in docs if d.cls == is_local), default=0)
    intra = max((d.length for d in docs if d.cls != inter), default=0)
    return Thresholds(local, max(local, intra), why)


def rank_tokens(lengths: Sequence[int], groups: Mapping[int, Tuple[int, ...]], world: int) -> List[int]:
    """Attention-layout tokens per rank implied by a doc -> group map."""
    tok = [0] * world
    for i, g in groups.items():
        for r, t in zip(g, member_tokens(int(lengths[i]), len(g))):
            tok[r] += t
    return tok


def setting_candidates(settings: Sequence[Tuple[int, Callable[[], Placement]]], what: str) -> Iterator[Candidate]:
    """One Candidate per run-level value (value, build) of the PlanMeta field ``what``, in the order
    given (strategies.choose keeps the first of equal predictions); a build raising PlanError (e.g.
    over capacity) becomes a Candidate carrying that error, which choose skips and names."""
    for value, build in settings:
        try:
            pl = build()
        except PlanError as e:
            yield Candidate(None, setting=(what, value), error=e)
            continue
        yield Candidate(pl, setting=(what, value))
