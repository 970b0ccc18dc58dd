"""Assembly: a strategy's Placement -> the full Plan (layouts, remap, routed schedule, prediction).

Every strategy goes through here, so every Plan is built the same way and the runtime and the
simulator see the same kind of data whichever strategy made it. With ``Placement.balance_linear``
(Zeppelin) the remap's linear layout equalises each node's ranks' predicted time instead of their
token counts (node_time_targets), within per-rank caps that keep every rank's peak activation memory
(attention-layout tokens and linear-layout tokens, each at its bytes per token) within
MEMORY_BALANCE of the mean where the node's tokens allow (memory_caps).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from operator import attrgetter
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from megatron_zeppelin.planner.context import Placement, PlanContext
from megatron_zeppelin.planner.build.layout import attention_layout
from megatron_zeppelin.planner.build.levels import linear_level, smallest_level
from megatron_zeppelin.planner.build.padding import charged_docs, charged_ops
from megatron_zeppelin.planner.cost.predict import attention_tokens, lower_bound, predict, ring_costs
from megatron_zeppelin.planner.program import local_arrays
from megatron_zeppelin.planner.build.remap import remap_flows, remap_moves
from megatron_zeppelin.planner.build.routing import route_schedule
from megatron_zeppelin.planner.build.schedule import ring_ops
from megatron_zeppelin.planner.types import Plan, PlanError, PlanMeta, ring_documents
from megatron_zeppelin.spec.memory import activation_bytes
from megatron_zeppelin.spec.words import CLASSES, Comm, DocClass, Layout

_DOC = attrgetter("doc")


@dataclass(frozen=True)
class Prepared:
    """What a placement fixes whatever the remap does: rings and documents in queue order, the
    attention layout, the (routed) schedule and the ring costs. Shared by variants that differ only
    in their remap (planner/partitioner/partition.py), so those are assembled once. The attention
    layout's segments are cut when first read: a candidate its least prediction rules out never
    needs them (a CP shape over 1k documents cuts 16-32k), and every prediction reads ``att_tokens``."""
    rings: tuple
    docs: tuple
    ops: list
    parts: tuple
    att_tokens: tuple  # attention-layout tokens per rank
    local: list  # the local documents in document order (layout.attention_layout's)
    world: int

    @cached_property
    def attention_layout(self) -> tuple:
        return attention_layout(self.docs, self.rings, self.world, self.local)


def prepare(ctx: PlanContext, placement: Placement, costs: bool = True) -> Prepared:
    """``placement``'s Prepared; ``costs`` False: without the ring costs (``parts`` None, see
    ``priced``), all a simulation and the memory check read."""
    topo, cost = ctx.topology, ctx.cost
    # Queue order: inter rings first, then intra; stable within a class; ids renumbered.
    order = sorted(range(len(placement.rings)),
                   key=lambda i: (CLASSES.index(placement.rings[i].cls), i))
    local = placement.local  # in document order where the strategy has them, and then so are its docs
    if all(placement.rings[i].id == k for k, i in enumerate(order)):  # already so (the partitioner's)
        rings = tuple(placement.rings)
        docs = placement.docs
        if local is None and list(map(_DOC, docs)) != list(range(len(docs))):
            docs = sorted(docs, key=_DOC)
        docs = tuple(docs)
    else:
        new_id = {placement.rings[i].id: k for k, i in enumerate(order)}
        rings = tuple(replace(placement.rings[i], id=new_id[placement.rings[i].id]) for i in order)
        docs = tuple(sorted((replace(d, ring=new_id[d.ring]) if d.ring >= 0 else d for d in placement.docs),
                            key=_DOC))
    local = _local(placement, docs)
    dmap = ring_documents(docs, rings)  # ring_ops reads ring documents only
    ops = ring_ops(rings, dmap, topo, cost.kv_bytes_per_token, cost.link_of, cost.model.q_bytes_per_token(cost.tp))
    if placement.routing:
        ops = route_schedule(ops, topo, cost, ctx.config, ctx.exchanges)
    if placement.padded:  # priced as the real system runs it: pad rows computed, exchanged, held
        cdocs = charged_docs(docs)
        arrays = local_arrays(cdocs)
        tokens = tuple(attention_tokens(cdocs, rings, topo.world_size, arrays).astype(np.int64).tolist())
        return Prepared(rings, docs, ops, _ring_costs(ctx, placement, docs, rings, ops, arrays) if costs else None,
                        tokens, local, topo.world_size)
    arrays = local_arrays(docs, local)  # the attention tokens and the ring costs both read them
    tokens = tuple(attention_tokens(docs, rings, topo.world_size, arrays).astype(np.int64).tolist())
    return Prepared(rings, docs, ops, _ring_costs(ctx, placement, docs, rings, ops, arrays) if costs else None,
                    tokens, local, topo.world_size)


def priced(ctx: PlanContext, placement: Placement, pre: Prepared) -> Prepared:
    """``pre`` (prepared unpriced) with its ring costs, as ``prepare`` prices them."""
    if pre.parts is not None:
        return pre
    out = replace(pre, parts=_ring_costs(ctx, placement, pre.docs, pre.rings, pre.ops))
    if "attention_layout" in pre.__dict__:  # already cut: the same segments
        out.__dict__["attention_layout"] = pre.__dict__["attention_layout"]
    return out


def _local(placement: Placement, docs) -> list:
    """The local documents in document order (the strategy's own list where it has one): both
    per-rank views and the ring costs read them."""
    if placement.local is not None:
        return placement.local
    local_ = DocClass.LOCAL  # bound once (spec/words.py)
    return [d for d in docs if d.cls == local_]


def _ring_costs(ctx: PlanContext, placement: Placement, docs, rings, ops, arrays=None):
    """ring_costs of a placement's documents; a padded one's as the padded system runs them (its
    charged documents and their ring messages). ``arrays``: those documents' local arrays, where
    the caller has them."""
    if placement.padded:
        cdocs = charged_docs(docs)
        return ring_costs(cdocs, rings, charged_ops(rings, cdocs, ctx.cost, ctx.config, placement.routing), ctx.cost,
                          local_arrays(cdocs) if arrays is None else arrays, ctx.exchanges)
    return ring_costs(docs, rings, ops, ctx.cost,
                      local_arrays(docs, _local(placement, docs)) if arrays is None else arrays, ctx.exchanges)


class Flow(NamedTuple):
    """Tokens ``src`` sends ``dst`` in a remap, before its segments are cut: all a least prediction
    reads of a Move (``tokens``, ``src``, ``dst``)."""
    src: int
    dst: int
    tokens: int


class Remap:
    """A prepared placement's remap: its ``flows`` (remap.remap_flows) at once, its linear layout and
    moves (``layout()``, segments cut once) only when the plan is assembled: a variant that its least
    prediction rules out never needs them."""

    def __init__(self, prepared: "Prepared", flows: Optional[dict]):
        self.flows, self._pre, self._layout = flows, prepared, None

    @property
    def attention_layout(self) -> tuple:
        """Its placement's attention layout (the prepared one's segments, cut once)."""
        return self._pre.attention_layout

    @property
    def counted(self) -> Tuple[Flow, ...]:
        return tuple(Flow(s, d, n) for (s, d), n in (self.flows or {}).items())

    def layout(self) -> Tuple[tuple, tuple]:
        """(linear layout, moves): the attention layout unmoved without a remap."""
        if self._layout is None:
            att = self._pre.attention_layout
            self._layout = (att, ()) if self.flows is None else remap_moves(att, self.flows)
        return self._layout


def remapped(ctx: PlanContext, placement: Placement, pre: Prepared) -> Remap:
    """The remap of a prepared placement (flows None: none, the attention layout stays)."""
    topo, cost = ctx.topology, ctx.cost
    if not placement.remap:
        return Remap(pre, None)
    caps = None
    if placement.balance_linear:
        # Ranks busier with attention + exposed communication + their projections (which run on
        # the attention layout and so cannot move) get fewer linear tokens: only the MLP-side
        # work (MLP and vocab head) is movable by the remap.
        tokens, parts = pre.att_tokens, pre.parts
        busy = (np.asarray(parts[0]) + np.asarray(parts[1]) + cost.proj_s_np(np.asarray(tokens))).tolist()
        limit = memory_caps(tokens, topo.gpus_per_node, *activation_weights(cost), ctx.capacity)
        caps = node_time_targets(busy, tokens, topo.gpus_per_node, cost.mlp_s(1), limit)
    return Remap(pre, remap_flows(list(pre.att_tokens), topo, cost=cost, capacities=caps))


def least_iteration_s(ctx: PlanContext, pre: Prepared, remap: Remap) -> float:
    """A lower bound of the predicted iteration of a prepared placement with ``remap`` (its
    ``remapped``), at a fraction of assembling it (predict's ``least``; no segment cut)."""
    return max(c.total_s for c in predict(pre.docs, pre.rings, (), pre.ops, remap.counted, ctx.cost,
                                          parts=pre.parts, att_tokens=pre.att_tokens, least=True))


def assemble(strategy: str, lengths: Sequence[int], ctx: PlanContext, placement: Placement,
             prepared: Optional[Prepared] = None, lower_bound_s: Optional[float] = None,
             moved: Optional[Remap] = None, predicted: bool = True) -> Plan:
    """The Plan of ``placement``; ``prepared``: its prepare() when shared with other candidates;
    ``lower_bound_s``: the batch's lower_bound when the caller assembles several candidates;
    ``moved``: its ``remapped`` when the caller has it. ``predicted`` False (a placement without a
    remap): no prediction, ``cost`` empty: a plan to simulate, checked against the memory as every
    plan is (the bench's settings that may stop early, sim/dominated.py: ``prepared`` unpriced)."""
    topo, cost = ctx.topology, ctx.cost
    predicted = predicted or placement.remap  # a time-balanced remap reads the ring costs
    pre = prepared or prepare(ctx, placement, predicted)
    if predicted:
        pre = priced(ctx, placement, pre)
    docs, rings, ops, parts = pre.docs, pre.rings, pre.ops, pre.parts
    moved = moved if moved is not None else remapped(ctx, placement, pre)
    lin, moves = moved.layout()
    att = moved.attention_layout
    rank_cost = predict(docs, rings, lin, ops, moves, cost, parts=parts, att_tokens=pre.att_tokens) if predicted else ()
    fits = ctx.capacity if ctx.memory_first else ctx.config.capacity_tokens
    if fits:  # a set capacity is memory: every strategy must fit it
        _check_fits(strategy, att, lin, fits)
        worst = max(range(topo.world_size), key=lambda r: (pre.att_tokens[r], -r))
        if placement.padded and pre.att_tokens[worst] > fits:  # its pad rows are held too
            raise PlanError(f"{strategy} runs out of memory: rank {worst} holds {pre.att_tokens[worst]} tokens with "
                            f"their padding > capacity {fits} (--zeppelin-capacity-tokens)")
    return Plan(strategy=strategy, topology=topo, lengths=tuple(map(int, lengths)), docs=docs,
                rings=rings, attention_layout=att, linear_layout=lin, remap=tuple(moves),
                schedule=tuple(ops), cost=rank_cost,
                lower_bound_s=lower_bound(lengths, cost) if lower_bound_s is None else lower_bound_s,
                thresholds=placement.thresholds, kv_bytes_per_token=cost.kv_bytes_per_token,
                meta=PlanMeta.from_pairs(plan_meta(placement.meta, cost, rings)),
                allreduce_s=cost.dp_allreduce_s())


def plan_meta(meta: dict, cost, rings=()) -> tuple:
    """The strategy's notes, the recompute the plan is priced with (the simulator reads it) and,
    with a2a rings, the Q bytes per token that size their messages (the checker reads it)."""
    extra = {} if cost.recompute.none else {"recompute": cost.recompute.describe()}
    if any(r.comm in (Comm.A2A, Comm.A2A_P2P) for r in rings):
        extra["q_bytes_per_token"] = str(cost.model.q_bytes_per_token(cost.tp))
    return tuple(sorted((str(k), str(v)) for k, v in {**meta, **extra}.items()))


MEMORY_BALANCE = 1.10  # Zeppelin's goal for per-rank peak activation memory, max / mean


def activation_weights(cost) -> Tuple[float, float]:
    """Activation bytes a rank keeps per token of its attention layout and per token of its linear
    layout: spec/memory.py's model (all layers, the head on the linear layout) with the run's recompute
    and sequence parallelism (``cost.recompute``, ``cost.sp``), as plan_memory_balance reports it."""
    n = 1 << 20  # per token, without the model's integer rounding
    return (activation_bytes(cost.model, n, 0, cost.tp, cost.recompute, cost.sp) / n,
            activation_bytes(cost.model, 0, n, cost.tp, cost.recompute, cost.sp) / n)


def memory_caps(att_tokens: Sequence[int], gpus_per_node: int, att_bytes: float, lin_bytes: float,
                capacity: int, balance: float = MEMORY_BALANCE) -> np.ndarray:
    """Per-rank linear-layout token caps that keep att_bytes * attention tokens + lin_bytes * linear
    tokens within ``balance`` x the mean over ranks (and within ``capacity``). A node whose ranks
    could not then hold its own tokens gets the lowest common memory level that holds them (the
    remap keeps node totals).

    >>> memory_caps([10, 0, 5, 5], 2, 1.0, 1.0, 100, balance=1.0).tolist()  # mean memory 10 per rank
    [0, 10, 5, 5]
    """
    att = np.asarray(att_tokens, dtype=np.float64).reshape(-1, gpus_per_node)
    mean = (att_bytes + lin_bytes) * att.sum() / att.size
    n_tok = att.sum(axis=1)

    def caps(level):  # [nodes, gpus] caps at a memory level per node
        return np.clip(np.floor((level[:, None] - att_bytes * att) / lin_bytes), 0, capacity)

    lo = np.full(len(att), balance * mean)
    short = caps(lo).sum(axis=1) < n_tok
    if short.any():  # some node needs a higher level: its least, to the float (levels.py)
        hi = lo + att_bytes * att.max() + lin_bytes * (n_tok + 1)
        lo = np.where(short, smallest_level(lambda T: caps(T).sum(axis=1), n_tok, lo, hi,
                                            _step_guess(att_bytes * att, lin_bytes, capacity, n_tok)), lo)
    return caps(lo).astype(np.int64).reshape(-1)


def _step_guess(base: np.ndarray, rate: float, capacity: int, need: np.ndarray) -> np.ndarray:
    """Where the floored fill sum(clip(floor((T - base) / rate), 0, capacity)) of each node (rows)
    reaches ``need``, about: the unfloored level, then the next steps of its ranks for the tokens the
    floors lose (an estimate for levels.smallest_level, which makes it exact)."""
    cap = np.full(base.shape, float(capacity))
    T = linear_level(base, rate, cap, need.astype(np.float64))
    k = np.clip(np.floor((T[:, None] - base) / rate), 0, capacity)
    nxt = np.sort(np.where(k < capacity, base + rate * (k + 1), np.inf), axis=1)
    m = (need - k.sum(axis=1)).astype(np.int64)
    pick = nxt[np.arange(len(T)), np.clip(m - 1, 0, base.shape[1] - 1)]
    return np.where((m > 0) & np.isfinite(pick), pick, T)


def node_time_targets(busy: Sequence[float], tokens: Sequence[int], gpus_per_node: int, rate: float,
                      capacity) -> List[int]:
    """Linear-layout tokens per rank that equalise busy + rate * tokens inside each node, keeping
    each node's total (so the remap moves tokens over NVLink only), within ``capacity`` (one for
    every rank, or one per rank).

    >>> node_time_targets([4.0, 0.0, 1.0, 1.0], [2, 6, 3, 3], 2, 1.0, 100)   # node 0: 4+2 = 0+6
    [2, 6, 3, 3]
    >>> node_time_targets([3.0, 0.0], [4, 4], 2, 1.0, 100)   # 3 + 2.5 = 0 + 5.5 -> 2 and 6 tokens
    [3, 5]
    """
    b = np.asarray(busy, dtype=np.float64).reshape(-1, gpus_per_node)
    n_tok = np.asarray(tokens, dtype=np.int64).reshape(-1, gpus_per_node).sum(axis=1)
    cap = np.broadcast_to(np.asarray(capacity, dtype=np.float64), (b.size,)).reshape(b.shape)
    # Per node the least level T with sum(clip((T - busy) / rate, 0, cap)) >= its tokens (levels.py).
    lo = b.min(axis=1)
    hi = b.max(axis=1) + rate * n_tok + rate
    hi = smallest_level(lambda T: np.clip((T[:, None] - b) / rate, 0.0, cap).sum(axis=1), n_tok, lo, hi,
                        linear_level(b, rate, cap, n_tok))
    x = np.clip((hi[:, None] - b) / rate, 0.0, cap)
    out = np.floor(x).astype(np.int64)
    # Round to the node total: the largest remainders get the +1s (ties: lower rank).
    left = (n_tok - out.sum(axis=1))[:, None]
    frac = x - out
    idx = np.broadcast_to(np.arange(gpus_per_node), out.shape)
    for sign, key in ((1, lambda: -np.where(out < cap, frac, -1.0)), (-1, lambda: frac)):
        if (sign * left > 0).any():  # each node's first sign * left ranks in (key, rank) order
            order = np.lexsort((idx, key()), axis=-1)
            pos = np.empty_like(order)
            np.put_along_axis(pos, order, idx, axis=1)  # each rank's place in its node's order
            out += sign * (pos < sign * left)
    return out.reshape(-1).tolist()


def _check_fits(strategy: str, att, lin, capacity: int) -> None:
    """PlanError when a rank holds more than ``capacity`` tokens in either layout (out of memory).

    >>> from megatron_zeppelin.planner.types import Segment
    >>> _check_fits("packed_dp", [[Segment(0, 0, 6)], []], [[Segment(0, 0, 6)], []], 4)
    Traceback (most recent call last):
    ...
    megatron_zeppelin.planner.errors.PlanError: packed_dp runs out of memory: rank 0 holds 6 tokens in its attention layout > capacity 4 (--zeppelin-capacity-tokens)
    """
    for name, layout in ((Layout.ATTENTION, att), (Layout.LINEAR, lin)):
        for r, segs in enumerate(layout):
            n = sum(s.stop - s.start for s in segs)
            if n > capacity:
                raise PlanError(f"{strategy} runs out of memory: rank {r} holds {n} tokens in its {name} layout "
                                f"> capacity {capacity} (--zeppelin-capacity-tokens)")
