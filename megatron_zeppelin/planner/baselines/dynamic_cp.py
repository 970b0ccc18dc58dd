"""dynamic_cp: Megatron-Core's hybrid / dynamic context parallelism (DefaultDynamicCPScheduler).

Megatron's heuristic (megatron/core/datasets/data_schedule*.py, followed here, not copied), with
``max_seqlen_per_dp_cp_rank`` = the per-rank capacity C:

- a document of L tokens needs ``gpus_needed(L)`` = the smallest power of two g with g*C >= L ranks;
  its per-rank workload is L^2 / g (the sequence-length-squared proxy of attention FLOPs);
- documents sorted by length, descending (ties by index), are cut into k buckets of about equal
  workload, k = the number of distinct group sizes;
- one *HDP group* (a micro-batch over all DPxCP ranks) is formed by taking the head of the first
  bucket that can be placed: it joins the least loaded existing group of its size that still has
  room, unless free ranks can form a new group whose busiest member is less loaded (always true in a
  fresh round); new groups are blocks of consecutive ranks; once a smaller size has appeared and the
  workloads are within 5% (``DELTA``), the group closes and the rest wait for the next round;
- ranks left without work in a round get it by doubling the smallest group (Megatron's
  ``fill_empty_gpus``).

Best settings: ``max_seqlen_per_dp_cp_rank`` is Megatron's tuning knob; it is tried at C, C/2, C/4, ...
(down to what the largest group can hold) and the predicted-fastest value is kept (``meta``).

Megatron runs the rounds as successive micro-batches, with a DP x CP barrier after each
(``round_placements``: one placement per round; the benchmark's runs time dynamic_cp this way,
sim/runs.py). ``dynamic_cp_placement`` merges them into one plan (a rank runs its rounds one after
another, which can only shorten the iteration), the strategy's Plan for the runtime; there
workloads and token counts accumulate across rounds, the per-rank capacity holds for the sum, and a
new group takes the aligned block of free ranks whose busiest member is least loaded (the lowest
block in the first round, as in Megatron). If a fresh round can place nothing because earlier rounds
filled the ranks (tight capacity), its longest document takes the least loaded aligned block with room,
doubling the group size as needed. No routing, no remap.

Example: 4 ranks, capacity 4 tokens: 8 tokens need 2 ranks, 4 and 3 one each.

>>> gpus_needed(8, 4), gpus_needed(4, 4), gpus_needed(3, 4), workload(8, 4)
(2, 1, 1, 32.0)
>>> from megatron_zeppelin.planner.testing import toy_context
>>> p = dynamic_cp_placement([8, 4, 3], toy_context(gpus=4, capacity=4), mslpr=4)
>>> [(r.ranks, r.docs) for r in p.rings], [(d.doc, d.owner) for d in p.docs if d.cls == "local"]
([((0, 1), (0,))], [(1, 2), (2, 3)])
"""

from __future__ import annotations

from collections import deque
from typing import Dict, Iterable, List, Sequence, Tuple

from megatron_zeppelin.planner.context import Placement, PlanContext
from megatron_zeppelin.planner.strategies import Candidate, strategy
from megatron_zeppelin.planner.types import PlanError
from megatron_zeppelin.planner.baselines.cp_groups import aligned_blocks, member_tokens, placement_from_groups, setting_candidates
from megatron_zeppelin.spec.words import Comm, StrategyName

DELTA = 0.05  # Megatron's next_hdp_group default: close the group when loads are within 5%
BUCKET_SLACK = 1.1  # Megatron's dcp_make_buckets_equal: a bucket may exceed its target by 10%


def gpus_needed(length: int, cap: int) -> int:
    g = 1
    while g * cap < length:
        g *= 2
    return g


def workload(length: int, cap: int) -> float:
    return float(length) * length / gpus_needed(length, cap)


def equal_buckets(samples: List[Tuple[int, int]], cap: int) -> List[deque]:
    """(index, length) samples, longest first, cut into k buckets of about equal workload."""
    k = len({gpus_needed(L, cap) for _, L in samples})
    target = sum(workload(L, cap) for _, L in samples) / k
    buckets, cur, cur_w, left = [], [], 0.0, k
    for n, (i, L) in enumerate(samples):
        w = workload(L, cap)
        if cur and (cur_w + w > target * BUCKET_SLACK or len(samples) - n <= left - len(buckets)):
            buckets.append(deque(cur))
            cur, cur_w, left = [], 0.0, left - 1
        cur.append((i, L))
        cur_w += w
    if cur:
        buckets.append(deque(cur))
    return buckets


class _Round:
    """One HDP group: groups of this round on top of the loads of the earlier rounds."""

    def __init__(self, world: int, mslpr: int, cap: int, load: List[float], tok: List[int]):
        self.world, self.mslpr, self.cap, self.load, self.tok = world, mslpr, cap, load, tok
        self.round_tok = [0.0] * world  # Megatron's packing_sequence_len, per rank
        self.free = [True] * world
        self.groups: List[Tuple[int, ...]] = []  # in creation order
        self.docs: Dict[Tuple[int, ...], List[Tuple[int, int]]] = {}
        self._members: Dict[Tuple[int, int], List[int]] = {}  # member_tokens(L, g): asked per block
        self._blocks: Dict[int, List[Tuple[int, ...]]] = {}  # aligned_blocks(g, world)

    def room(self, block, L) -> bool:
        """Megatron's rule (this round's tokens per rank <= mslpr) and the plan's capacity (all rounds)."""
        g = len(block)
        share, key = L / g, (L, g)
        if key not in self._members:
            self._members[key] = member_tokens(L, g)
        rt, tok, mslpr, cap = self.round_tok, self.tok, self.mslpr, self.cap
        for r, t in zip(block, self._members[key]):
            if rt[r] + share > mslpr or tok[r] + t > cap:
                return False
        return True

    def placeable(self, g: int) -> bool:
        return any(len(b) == g for b in self.groups) or self._new_block(g, None) is not None

    def _new_block(self, g: int, L):
        """The least loaded free aligned block of g ranks (ties: the lowest) with room for L (None:
        any): the free blocks in that order, room asked until one has it (room is the costly test)."""
        free, load = self.free, self.load
        if g not in self._blocks:
            self._blocks[g] = aligned_blocks(g, self.world)
        if g == 1:  # most documents: one rank each
            cands = [((load[b[0]], b[0]), b) for b in self._blocks[1] if free[b[0]]]
        else:
            cands = [((max([load[r] for r in b]), b[0]), b) for b in self._blocks[g] if all([free[r] for r in b])]
        if L is None:
            return min(cands) if cands else None
        cands.sort()
        return next((c for c in cands if self.room(c[1], L)), None)

    def place(self, i: int, L: int) -> bool:
        g = gpus_needed(L, self.mslpr)
        load = self.load
        old = sorted([(max([load[r] for r in b]), n, b) for n, b in enumerate(self.groups) if len(b) == g])
        best = next((o for o in old if self.room(o[2], L)), None)  # the least of those with room
        new = self._new_block(g, L)
        if new is not None and (best is None or new[0][0] < best[0]):
            block = new[1]
            self.groups.append(block)
            self.docs[block] = []
            for r in block:
                self.free[r] = False
        elif best is not None:
            block = best[2]
        else:
            return False
        self._add(block, i, L, +1)
        self.docs[block].append((i, L))
        return True

    def _add(self, block, i, L, sign):
        for r, t in zip(block, member_tokens(L, len(block))):
            self.load[r] += sign * float(L) * L / len(block)
            self.tok[r] += sign * t
            self.round_tok[r] += sign * L / len(block)

    def _move(self, docs, src, dst):
        for i, L in docs:
            self._add(src, i, L, -1)
            self._add(dst, i, L, +1)

    def force(self, i: int, L: int, top: int) -> bool:
        """Past Megatron: when a fresh round can place nothing (earlier rounds filled the ranks it
        would use), the document takes the least loaded aligned block with room, growing the group."""
        g = gpus_needed(L, self.mslpr)
        while g <= top:
            blocks = [b for b in aligned_blocks(g, self.world) if all(self.free[r] for r in b)
                      and all(self.tok[r] + t <= self.cap for r, t in zip(b, member_tokens(L, g)))]
            if blocks:
                block = min(blocks, key=lambda b: (max(self.load[r] for r in b), b[0]))
                self.groups.append(block)
                self.docs[block] = [(i, L)]
                for r in block:
                    self.free[r] = False
                self._add(block, i, L, +1)
                return True
            g *= 2
        return False

    def fill_empty(self) -> None:
        """Double the smallest group (creation order) whose aligned buddy block is free."""
        while any(self.free) and self.groups:
            for n, b in sorted(enumerate(self.groups), key=lambda x: (len(x[1]), x[0])):
                g2 = 2 * len(b)
                start = b[0] - b[0] % g2
                big = tuple(range(start, start + g2))
                if start + g2 > self.world or not all(r in b or self.free[r] for r in big):
                    continue
                self._move(self.docs[b], b, big)
                if any(self.tok[r] > self.cap for r in big):  # earlier rounds left no room
                    self._move(self.docs[b], big, b)
                    continue
                self.docs[big] = self.docs.pop(b)
                self.groups[n] = big
                for r in big:
                    self.free[r] = False
                break
            else:
                return  # no group can grow into free ranks: they stay idle this round


@strategy(StrategyName.DYNAMIC_CP, order=5, searches=True)
def plan_dynamic_cp(lengths: Sequence[int], ctx: PlanContext, search=None) -> Iterable[Candidate]:
    """Best max_seqlen_per_dp_cp_rank for the batch: the capacity, or a power-of-two fraction of it
    (smaller values split more documents), whichever the cost model predicts fastest."""
    world, cap = ctx.topology.world_size, ctx.capacity
    top = 1 << (world.bit_length() - 1)  # largest power-of-two group of the domain
    floor = -(-max(lengths) // top)
    cands, m = [], cap
    while m >= max(1, floor) and len(cands) <= world.bit_length():
        cands.append((m, (lambda m=m: dynamic_cp_placement(lengths, ctx, m))))
        m //= 2
    if len(cands) == 1:
        return (Candidate(dynamic_cp_placement(lengths, ctx, cap)),)
    return setting_candidates(cands[::-1], "max_seqlen_per_dp_cp_rank")  # ascending: ties keep the smaller


def dynamic_cp_rounds(lengths: Sequence[int], ctx: PlanContext, mslpr: int) -> List[Dict[int, Tuple[int, ...]]]:
    """Megatron's HDP rounds: per round, {document: its rank group}."""
    world, cap = ctx.topology.world_size, ctx.capacity
    top = 1 << (world.bit_length() - 1)
    for i, L in enumerate(lengths):
        if gpus_needed(L, mslpr) > top:
            raise PlanError(f"dynamic_cp: document {i} ({L} tokens) needs {gpus_needed(L, mslpr)} ranks of "
                            f"{mslpr} tokens but groups hold at most {top}: raise --zeppelin-capacity-tokens")
    samples = sorted(((i, int(L)) for i, L in enumerate(lengths)), key=lambda s: (-s[1], s[0]))
    load, tok = [0.0] * world, [0] * world
    rounds: List[Dict[int, Tuple[int, ...]]] = []
    while samples:
        rnd = _Round(world, mslpr, cap, load, tok)
        buckets = equal_buckets(samples, mslpr)
        first_g, smaller_seen, placed = None, False, 0
        while buckets:
            pick = next((b for b in buckets if b and rnd.placeable(gpus_needed(b[0][1], mslpr))), None)
            if pick is None and not placed:
                pick = next(b for b in buckets if b)
            if pick is None:
                break
            i, L = pick[0]
            if not rnd.place(i, L):  # its size exists but no group of it has room: next round
                if placed or not rnd.force(i, L, top):
                    break
            pick.popleft()
            placed += 1
            g = gpus_needed(L, mslpr)
            first_g = first_g or g
            smaller_seen = smaller_seen or g < first_g
            while buckets and not buckets[0]:
                buckets.pop(0)
            if smaller_seen and buckets and max(load) - min(load) <= DELTA * max(load):
                break
        if not placed:
            raise PlanError(f"dynamic_cp: {len(samples)} document(s) fit no rank group at capacity {cap} "
                            "tokens: raise --zeppelin-capacity-tokens")
        rnd.fill_empty()
        rounds.append({i: block for block, docs in rnd.docs.items() for i, _ in docs})
        samples = [s for b in buckets for s in b]
        samples.sort(key=lambda s: (-s[1], s[0]))
    return rounds


def _why(mslpr: int, rounds: int) -> str:
    return (f"Megatron dynamic CP: power-of-two groups of g ranks with g*{mslpr} >= length, "
            f"workload length^2/g balanced over {rounds} HDP round(s)")


def dynamic_cp_placement(lengths: Sequence[int], ctx: PlanContext, mslpr: int) -> Placement:
    """All rounds merged into one plan (a rank runs its rounds one after another, no barrier
    between them): the strategy's plan, what the engine executes for ``--zeppelin-strategy dynamic_cp``."""
    rounds = dynamic_cp_rounds(lengths, ctx, mslpr)
    groups = {i: b for rnd in rounds for i, b in rnd.items()}
    return placement_from_groups(lengths, groups, ctx, Comm.P2P, _why(mslpr, len(rounds)),
                                 {"hdp_rounds": str(len(rounds)), "max_seqlen_per_dp_cp_rank": str(mslpr)})


def round_placements(lengths: Sequence[int], ctx: PlanContext, mslpr: int) -> List[Tuple[List[int], Placement]]:
    """Megatron's execution: each HDP round is its own micro-batch (its sub-samples only), run after
    the previous one with a DP x CP barrier between them. Per round: (the batch's document indices
    in it, its placement over those documents, renumbered 0..n-1)."""
    out = []
    rounds = dynamic_cp_rounds(lengths, ctx, mslpr)
    for k, rnd in enumerate(rounds):
        docs = sorted(rnd)
        sub = [int(lengths[i]) for i in docs]
        groups = {n: rnd[i] for n, i in enumerate(docs)}
        out.append((docs, placement_from_groups(sub, groups, ctx, Comm.P2P, _why(mslpr, len(rounds)),
                                                {"hdp_round": str(k), "hdp_rounds": str(len(rounds)),
                                                 "max_seqlen_per_dp_cp_rank": str(mslpr)})))
    return out
