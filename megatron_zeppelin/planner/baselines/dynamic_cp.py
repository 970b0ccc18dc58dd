"""dynamic_cp: Megatron-Core's dynamic context parallelism, its packing-aware scheduler.

Source (read, followed here, not copied): Megatron-LM's dev branch, PR #5154 "Improve default dynamic
CP packing scheduler" (commit d2e7ec5b88, 2026-06-27), as it stands at dev d48bd6be0a (2026-08-21):
``DefaultDynamicCPScheduler.get_groups_and_subsamples`` (megatron/core/datasets/data_schedule.py)
calls ``next_hdp_group_packing_aware`` and ``dcp_gpus_needed`` (megatron/core/datasets/
data_schedule_utils.py) until every sample is scheduled; ``min_dynamic_context_parallel_size``
(megatron/core/model_parallel_config.py) is its ``min_cp``. It replaced the bucket heuristic
(equal-workload buckets, a 5% balance stop, ``next_hdp_group``) that this module followed before.

With W the DP x CP ranks and m = ``max_seqlen_per_dp_cp_rank``:

- a document of L tokens needs ``gpus_needed(L)`` = max(min_cp, the smallest power of two g with
  g*m >= L) ranks; on g ranks its per-rank workload is L^2/g (``workload``);
- the global batch's documents, longest first (ties: index), are cut into *HDP rounds*, each one
  micro-batch over all W ranks, each from idle ranks (``hdp_round``):
  1. the round's longest document opens it on ranks 0..g-1, g = gpus_needed(L): Megatron's one forced
     placement, checked against nothing but W;
  2. the round's workload cap is longest x m x 1.05 (``WORKLOAD_CAP_DELTA``). Kept as Megatron
     has it, it never binds alone: a group's per-rank workload, the sum of L x L/g, is at most its
     longest document times its packed length (below), so at most longest x m;
  3. every other document, longest first, weighs each power-of-two size from gpus_needed(L) up to W:
     joining a group of that size whose packed length (sum of L/g over its documents) stays within m,
     or opening a new group on the lowest free ranks; the option whose busiest rank of the round
     after it is least wins (ties: the first weighed: smaller size, joining before opening, older
     group first), if that is within the cap; else the document waits for a later round. So a short
     document takes a larger group than it needs where that shortens the round's critical path;
  4. while ranks are idle, the first group of the smallest size doubles in place (to at most W), the
     groups after it shifting up (``fill_empty_gpus_once``); when no group can, the round becomes one
     group of all W ranks holding the longest documents whose L/W still fits m, in turn, the rest
     waiting (``fill_with_full_dpxcp_group``: the fallback to one full DP x CP group).
- capacity and balance are per round: Megatron frees a micro-batch's activations before the next,
  so nothing carries from one round to the next. The plan's per-rank capacity (exact zigzag tokens,
  ``ctx.capacity``) is checked per round beside Megatron's m rule: a document that would overfill a
  rank waits, as one that breaks the m rule does.

Megatron's groups are the aligned power-of-two blocks of ``create_dynamic_dp_cp_groups``
(megatron/core/parallel_state.py); its scheduler places groups on consecutive ranks in creation
order, which are those blocks in the batches it schedules (longest first, least peak), and the plans
here keep whatever ranks it picks (the engine runs rings on any ranks).

Best settings: ``max_seqlen_per_dp_cp_rank`` is Megatron's tuning knob; it is tried at C, C/2, C/4, ...
(down to what the largest group can hold) and the predicted-fastest value is kept (``meta``).
``min_cp`` stays at Megatron's default of 1 in the strategy.

Megatron runs the rounds as successive micro-batches, a DP x CP barrier after each
(``round_placements``: one placement per round; the benchmark's runs time dynamic_cp this way,
sim/runs.py). ``dynamic_cp_placement`` merges them into one plan, what the engine executes for
``--zeppelin-strategy dynamic_cp`` (a rank runs its rounds' documents one after another, no barrier
between them): it holds every round at once, so a set capacity binds its sum (assembly), and the
strategy keeps the settings whose merged plan fits. No routing, no remap.

Padding: Megatron's dynamic CP needs every sample divisible by 2 x DP x CP (x the SP size with
sequence parallelism: megatron/core/datasets/gpt_dataset.py:62-67, ``hybrid_context_parallel``, at
d98e8a6), whichever group it lands in, and its scheduler weighs the padded lengths (``padded_seq_len``:
data_schedule_utils.py:571-607). So the rounds here are scheduled on the documents padded to
``dcp_pad_multiple`` (gpus_needed, workload, packed length and capacity all count the pad rows), and
the plan records each padded length (DocPlan.padded): prediction and simulation charge the pad rows
(planner/build/padding.py), the engine runs the real ones. Zeppelin's dynamic_cp shapes
(portfolio/shapes.py) run on its own engine: Megatron's padded groups, laid out unpadded
(``dynamic_cp_placement``'s ``schedule_pad``).

Megatron's own cases (tests/unit_tests/test_sequence_packing.py of that commit): on 2 ranks with
m = 4096, 2048 tokens join the 6144-token document's group of 2 (a group of 1 of its own was
possible, but would idle a rank and finish later); on 14 ranks, two 50-token documents (m = 100)
end in one group of all 14 (doubling stops at 8, which cannot grow into the 6 idle ranks):

>>> from megatron_zeppelin.planner.testing import toy_context
>>> dynamic_cp_rounds([6144, 2048], toy_context(gpus=2), mslpr=4096, pad=False)
[{0: (0, 1), 1: (0, 1)}]
>>> [sorted(set(r.values())) for r in dynamic_cp_rounds([50, 50], toy_context(gpus=14), mslpr=100, pad=False)]
[[(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)]]

Padded (a multiple of 2 x 4 on 4 ranks), 7 tokens are held as 8:

>>> p = dynamic_cp_placement([7, 30], toy_context(gpus=4), mslpr=16)
>>> [(d.length, d.padded) for d in p.docs], p.meta["pad_multiple"]
([(7, 8), (30, 32)], '8')
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from megatron_zeppelin.planner.context import Placement, PlanContext
from megatron_zeppelin.planner.strategies import Candidate, strategy
from megatron_zeppelin.planner.types import PlanError
from megatron_zeppelin.planner.build.padding import held_capacity, pad_to
from megatron_zeppelin.planner.baselines.cp_groups import member_tokens, placement_from_groups, setting_candidates
from megatron_zeppelin.spec.words import Comm, StrategyName

WORKLOAD_CAP_DELTA = 0.05  # Megatron's _DYNAMIC_CP_WORKLOAD_CAP_DELTA: a round's cap is longest x m x 1.05


def gpus_needed(length: int, mslpr: int, min_cp: int = 1) -> int:
    """Megatron's dcp_gpus_needed: the smallest power of two g with g * mslpr >= length, at least min_cp.

    >>> gpus_needed(8, 4), gpus_needed(4, 4), gpus_needed(3, 4), gpus_needed(3, 4, min_cp=2)
    (2, 1, 1, 2)
    """
    g = 1
    while g * mslpr < length:
        g *= 2
    return max(g, min_cp)


def dcp_pad_multiple(ctx: PlanContext) -> int:
    """What Megatron's dynamic CP pads every sample to: 2 x DP x CP (the domain), x TP with sequence
    parallelism (gpt_dataset.py:62-67).

    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> dcp_pad_multiple(toy_context(gpus=4))
    8
    """
    return 2 * ctx.topology.world_size * (ctx.cost.tp if ctx.cost.sp and ctx.cost.tp > 1 else 1)


def held_lengths(lengths: Sequence[int], ctx: PlanContext, pad: bool) -> List[int]:
    """The lengths the scheduler weighs: padded to ``dcp_pad_multiple`` (``pad``), or as they are."""
    m = dcp_pad_multiple(ctx) if pad else 1
    return [pad_to(L, m) for L in lengths] if m > 1 else [int(L) for L in lengths]


def workload(length: int, g: int) -> float:
    """Megatron's per-rank workload of a document on g ranks: the length-squared proxy of attention."""
    return float(length) * length / g


Sample = Tuple[int, int]  # (document index, length)


class _Group:
    """One CP group of a round: ``size`` consecutive ranks from ``start``, its documents, each
    member's workload (all members carry the same), packed length (Megatron's
    packing_sequence_len: sum of L / size) and exact zigzag tokens per member."""

    __slots__ = ("start", "size", "docs", "load", "packed", "tok")

    def __init__(self, start: int, size: int):
        self.start, self.size = start, size
        self.docs: List[Sample] = []
        self.load, self.packed, self.tok = 0.0, 0.0, [0] * size

    @property
    def ranks(self) -> Tuple[int, ...]:
        return tuple(range(self.start, self.start + self.size))

    def fits(self, share: List[int], capacity: int) -> bool:
        return all(t + s <= capacity for t, s in zip(self.tok, share))

    def add(self, i: int, L: int, share: List[int]) -> None:
        self.docs.append((i, L))
        self.load += workload(L, self.size)
        self.packed += L / self.size
        self.tok = [t + s for t, s in zip(self.tok, share)]

    def resize(self, size: int) -> None:
        """Megatron's doubling: the same documents over ``size`` ranks, the workload recomputed."""
        docs, self.size = self.docs, size
        self.docs, self.load, self.packed, self.tok = [], 0.0, 0.0, [0] * size
        for i, L in docs:
            self.add(i, L, member_tokens(L, size))


class _Shares(dict):
    """member_tokens(L, g) by (L, g), each computed once for all the rounds of a batch (the
    exact split is most of a round's time where it is asked of every option)."""

    def __missing__(self, key: Tuple[int, int]) -> List[int]:
        self[key] = out = member_tokens(*key)
        return out


def hdp_round(samples: Sequence[Sample], world: int, mslpr: int, capacity: int,
              min_cp: int = 1, shares: _Shares = None) -> Tuple[List[_Group], List[Sample]]:
    """One HDP round (Megatron's next_hdp_group_packing_aware) of ``samples``, longest first:
    (its groups in rank order, the samples left for later rounds, in the same order)."""
    shares = _Shares() if shares is None else shares
    i0, tall = samples[0]
    g0 = gpus_needed(tall, mslpr, min_cp)
    if max(shares[(tall, g0)]) > capacity:
        raise PlanError(f"dynamic_cp: document {i0} ({tall} tokens) over {g0} ranks holds {max(shares[(tall, g0)])} "
                        f"tokens on a rank > capacity {capacity}: raise --zeppelin-capacity-tokens")
    first = _Group(0, g0)
    first.add(i0, tall, shares[(tall, g0)])
    groups, used, busiest = [first], g0, first.load  # groups fill ranks 0..used-1 in creation order
    by_size = {g0: [first]}  # the groups of each size in creation order, and their least packed length:
    least = {g0: first.packed}  # a size none of whose groups has room is passed over at once
    cap = float(tall) * mslpr * (1.0 + WORKLOAD_CAP_DELTA)
    left: List[Sample] = []
    for i, L in samples[1:]:
        best = None  # (busiest rank's workload after it, group or None for a new one, size)
        g = gpus_needed(L, mslpr, min_cp)
        while g <= world and not (best is not None and best[0] <= busiest):  # nothing beats the busiest
            w, per = workload(L, g), L / g
            for grp in (by_size[g] if least.get(g, mslpr) + per <= mslpr else ()):
                if grp.packed + per > mslpr:
                    continue
                peak = max(busiest, grp.load + w)
                if peak <= cap and (best is None or peak < best[0]) and grp.fits(shares[(L, g)], capacity):
                    best = (peak, grp, g)
            if world - used >= g and max(shares[(L, g)]) <= capacity:  # free ranks hold no work: the lowest ones
                peak = max(busiest, w)
                if peak <= cap and (best is None or peak < best[0]):
                    best = (peak, None, g)
            g *= 2
        if best is None:
            left.append((i, L))
            continue
        _, grp, g = best
        if grp is None:
            grp = _Group(used, g)
            groups.append(grp)
            by_size.setdefault(g, []).append(grp)
            used += g
        grp.add(i, L, shares[(L, g)])
        least[g] = min(x.packed for x in by_size[g])
        busiest = max(busiest, grp.load)
    while used < world:
        if not _double_smallest(groups, world, used):
            return _one_group(samples, world, mslpr, capacity, shares)
        used = groups[-1].start + groups[-1].size
    return groups, left


def _double_smallest(groups: List[_Group], world: int, used: int) -> bool:
    """Megatron's fill_empty_gpus_once: the first group of the smallest size grows to twice that
    (at most ``world``), the groups after it moving up; False when none can."""
    small = min(grp.size for grp in groups)
    extra = min(2 * small, world) - small
    for k, grp in enumerate(groups):
        end = grp.start + grp.size - 1
        # Megatron: the grown group must end below world. The idle ranks must also take the groups
        # moved up: Megatron indexes past the last rank there (e.g. 14 ranks, groups of 4 and 8, 2 idle)
        if grp.size != small or end + extra >= world or extra > world - used:
            continue
        grp.resize(small + extra)
        for later in groups[k + 1:]:
            later.start += extra
        return True
    return False


def _one_group(samples: Sequence[Sample], world: int, mslpr: int, capacity: int,
               shares: _Shares) -> Tuple[List[_Group], List[Sample]]:
    """Megatron's fill_with_full_dpxcp_group: the round redone as one group of every rank, taking
    the round's documents longest first while their packed length fits mslpr."""
    grp, left = _Group(0, world), []
    for i, L in samples:
        s = shares[(L, world)]
        if grp.packed + L / world <= mslpr and grp.fits(s, capacity):
            grp.add(i, L, s)
        else:
            left.append((i, L))
    if not grp.docs:
        raise PlanError(f"dynamic_cp: no document fits one group of all {world} ranks at max_seqlen_per_dp_cp_rank "
                        f"{mslpr}: raise --zeppelin-capacity-tokens")
    return [grp], left


@strategy(StrategyName.DYNAMIC_CP, order=5, searches=True)
def plan_dynamic_cp(lengths: Sequence[int], ctx: PlanContext, search=None) -> Iterable[Candidate]:
    """Best max_seqlen_per_dp_cp_rank for the batch: the capacity, or a power-of-two fraction of it
    (smaller values split more documents), whichever the cost model predicts fastest."""
    held = held_lengths(lengths, ctx, True)
    world, cap = ctx.topology.world_size, held_capacity(ctx, held)
    top = 1 << (world.bit_length() - 1)  # largest power-of-two group of the domain
    floor = -(-max(held) // top)
    cands, m = [], cap
    while m >= max(1, floor) and len(cands) <= world.bit_length():
        cands.append((m, (lambda m=m: dynamic_cp_placement(lengths, ctx, m))))
        m //= 2
    if len(cands) == 1:
        return (Candidate(dynamic_cp_placement(lengths, ctx, cap)),)
    return setting_candidates(cands[::-1], "max_seqlen_per_dp_cp_rank")  # ascending: ties keep the smaller


def dynamic_cp_rounds(lengths: Sequence[int], ctx: PlanContext, mslpr: int,
                      min_cp: int = 1, pad: bool = True) -> List[Dict[int, Tuple[int, ...]]]:
    """Megatron's HDP rounds (DefaultDynamicCPScheduler): per round, {document: its rank group};
    ``pad``: scheduled on the padded lengths, as Megatron's (``held_lengths``)."""
    world = ctx.topology.world_size
    lengths = held_lengths(lengths, ctx, pad)
    capacity = held_capacity(ctx, lengths) if pad else ctx.capacity  # pad rows held too
    if min_cp < 1 or min_cp & (min_cp - 1) or min_cp > world:
        raise PlanError(f"dynamic_cp: min_dynamic_context_parallel_size {min_cp} must be a power of two "
                        f"of at most the {world} ranks")
    samples = sorted(((i, int(L)) for i, L in enumerate(lengths)), key=lambda s: (-s[1], s[0]))
    need = gpus_needed(samples[0][1], mslpr, min_cp)
    if need > world:  # Megatron asserts this of each round's longest document
        raise PlanError(f"dynamic_cp: document {samples[0][0]} ({samples[0][1]} tokens) needs {need} ranks of "
                        f"{mslpr} tokens but the domain has {world}: raise --zeppelin-capacity-tokens")
    rounds: List[Dict[int, Tuple[int, ...]]] = []
    shares = _Shares()
    while samples:
        groups, samples = hdp_round(samples, world, mslpr, capacity, min_cp, shares)
        for grp in groups:  # a doubled group re-splits its documents: its members' exact tokens again
            if max(grp.tok) > capacity:
                raise PlanError(f"dynamic_cp: HDP round {len(rounds)} holds {max(grp.tok)} tokens on a rank of "
                                f"group {grp.ranks} > capacity {capacity}: raise --zeppelin-capacity-tokens")
        rounds.append({i: grp.ranks for grp in groups for i, _ in grp.docs})
    return rounds


def _why(mslpr: int, rounds: int) -> str:
    return (f"Megatron dynamic CP (packing-aware): groups of g >= length/{mslpr} ranks, a short document "
            f"on a larger group where that shortens the round; balanced per round over {rounds} HDP round(s)")


def _pad_meta(ctx: PlanContext, pad: bool) -> Dict[str, str]:
    m = dcp_pad_multiple(ctx) if pad else 1
    return {"pad_multiple": str(m)} if m > 1 else {}


def dynamic_cp_placement(lengths: Sequence[int], ctx: PlanContext, mslpr: int, min_cp: int = 1,
                         pad: bool = True, schedule_pad: Optional[bool] = None) -> Placement:
    """All rounds merged into one plan (a rank runs its rounds one after another, no barrier
    between them): the strategy's plan, what the engine executes for ``--zeppelin-strategy dynamic_cp``.
    ``schedule_pad`` (default ``pad``): the rounds scheduled on the padded lengths while the layout
    holds the real ones (pad=False, schedule_pad=True): Megatron's own groups on an engine that needs
    no pad rows (Zeppelin's shapes, portfolio/shapes.py). The packing-aware scheduler is not monotone
    in the lengths: unpadded, a micro-batch at 99% of a tight capacity took two rounds where Megatron's
    padded lengths take one, and the merged plan no longer fit.

    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> p = dynamic_cp_placement([7, 30], toy_context(gpus=4), mslpr=16, pad=False, schedule_pad=True)
    >>> [(d.length, d.padded) for d in p.docs], "pad_multiple" in p.meta
    ([(7, 0), (30, 0)], False)
    """
    rounds = dynamic_cp_rounds(lengths, ctx, mslpr, min_cp, pad if schedule_pad is None else schedule_pad)
    groups = {i: b for rnd in rounds for i, b in rnd.items()}
    return placement_from_groups(lengths, groups, ctx, Comm.P2P, _why(mslpr, len(rounds)),
                                 {"hdp_rounds": str(len(rounds)), "max_seqlen_per_dp_cp_rank": str(mslpr),
                                  **_pad_meta(ctx, pad)}, held_lengths(lengths, ctx, pad) if pad else None)


def round_placements(lengths: Sequence[int], ctx: PlanContext, mslpr: int,
                     min_cp: int = 1, pad: bool = True) -> List[Tuple[List[int], Placement]]:
    """Megatron's execution: each HDP round is its own micro-batch (its sub-samples only), run after
    the previous one with a DP x CP barrier between them. Per round: (the batch's document indices
    in it, its placement over those documents, renumbered 0..n-1)."""
    out = []
    rounds = dynamic_cp_rounds(lengths, ctx, mslpr, min_cp, pad)
    held = held_lengths(lengths, ctx, pad)
    for k, rnd in enumerate(rounds):
        docs = sorted(rnd)
        sub = [int(lengths[i]) for i in docs]
        groups = {n: rnd[i] for n, i in enumerate(docs)}
        out.append((docs, placement_from_groups(sub, groups, ctx, Comm.P2P, _why(mslpr, len(rounds)),
                                                {"hdp_round": str(k), "hdp_rounds": str(len(rounds)),
                                                 "max_seqlen_per_dp_cp_rank": str(mslpr), **_pad_meta(ctx, pad)},
                                                [held[i] for i in docs] if pad else None)))
    return out
