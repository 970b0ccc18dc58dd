"""Strategies: the protocol, the registry and the one place that assembles and picks.

A strategy proposes: given the lengths and the PlanContext it returns ``Candidate`` placements
(document classes, rings, owners). ``pick`` is the only code that turns candidates into Plans
(assemble.py) and keeps the least predicted one: a strategy never assembles, so every Plan of
every strategy is built and chosen the same way. A strategy that searches (Zeppelin) reads the
``Search`` it is given (the best prediction so far) to stop early or skip what cannot win; a
candidate's ``bound`` (a lower bound of its prediction) lets ``pick`` skip it unassembled, and a
remap variant's ``versus`` (the same placement without its remap, proposed later) lets ``pick``
assemble that one first and skip the variant on its least prediction (assemble.least_iteration_s).

Strategies register themselves with ``@strategy(name, order)`` where they are defined, under a
name of spec/config.py's STRATEGIES (what --zeppelin-strategy accepts). This module sits below
them: ``megatron_zeppelin.planner`` (its __init__, which Python runs before any of its modules)
imports the strategies' modules, so the registry is full wherever it is read. ``names()`` is the
registry's list in ``order``:

>>> names()
('zeppelin', 'packed_dp', 'static_cp', 'allgather_cp', 'hybrid_dp', 'dynamic_cp')
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Dict, Iterable, Optional, Sequence, Tuple

import numpy as np

from megatron_zeppelin.spec.config import STRATEGIES
from megatron_zeppelin.planner.build.assemble import assemble, least_iteration_s, remapped
from megatron_zeppelin.planner.choice import MEMORY_SLACK, MemoryChoice, SearchBudget, faster
from megatron_zeppelin.planner.context import Placement, PlanContext
from megatron_zeppelin.planner.cost.predict import lower_bound
from megatron_zeppelin.planner.types import Plan, PlanError
from megatron_zeppelin.spec.words import StrategyName


@dataclass(frozen=True)
class Candidate:
    """One placement worth assembling. ``label`` names it in the winner's Plan metadata
    (``variant``; empty: a strategy with one candidate); ``bound``: a lower bound of its predicted
    iteration (not assembled when at or above the best so far); ``prepared``: the assembly work it
    shares with other candidates of the same placement (assemble.prepare). ``setting``: the
    run-level value it was made with, as (PlanMeta field, value), e.g. ("cp_size", 4): the winner's
    ``<field>_predicted_s`` then lists every assembled setting's prediction. ``error``: why this
    setting has no placement (e.g. over capacity); it is skipped, and named if none is left.
    ``versus``: a candidate the strategy proposes later for sure (this placement, remap off): it
    is assembled first, and this one (a remap variant, with ``prepared``) is not assembled where
    even its least prediction could not be picked against it or the best so far."""
    placement: Optional[Placement]
    label: str = ""
    bound: float = 0.0
    prepared: Optional[object] = None
    setting: Optional[Tuple[str, int]] = None
    error: Optional[PlanError] = None
    versus: Optional["Candidate"] = None


@dataclass
class Search:
    """What ``pick`` has found so far, and the batch as arrays it computes once for the strategies
    and the lower bound (None where a caller builds a Search without them); strategies read it
    (never write it)."""
    best_s: float = float("inf")
    best: Optional[Plan] = None
    lengths: Optional[np.ndarray] = None  # the batch's lengths, int64
    whole_s: Optional[np.ndarray] = None  # each document's attention run whole (cost.doc_attention_np)
    budget: Optional[SearchBudget] = None  # Zeppelin's: work units left after its partitioner, what it cut

    def within(self, factor: float) -> bool:
        """The best plan so far is within ``factor`` x its lower bound."""
        return self.best is not None and self.best_s <= factor * self.best.lower_bound_s


@dataclass(frozen=True)
class Strategy:
    name: StrategyName
    order: int  # position in names()
    source: str  # module.function that registered it
    propose: Callable[[Sequence[int], PlanContext, Search], Iterable[Candidate]]


_REGISTRY: Dict[StrategyName, Strategy] = {}  # filled once, by the decorator, when planner/__init__ imports the strategies


def strategy(name: StrategyName, order: int, *, searches: bool = False):
    """Register the decorated function as strategy ``name`` (a member of the closed set
    spec/words.py StrategyName). A plain strategy is ``(lengths, ctx) -> Placement`` (one candidate);
    with ``searches=True`` it is ``(lengths, ctx, search) -> Iterable[Candidate]``. The function
    itself is returned unchanged."""
    if name not in tuple(StrategyName):
        raise PlanError(f"strategy '{name}' is not a StrategyName: add it to spec/words.py first")
    name = StrategyName(name)

    def register(fn):
        source = f"{fn.__module__}.{fn.__qualname__}"
        if name not in STRATEGIES:
            raise PlanError(f"strategy '{name}' ({source}) is not in spec/config.py STRATEGIES: add its name there")
        if name in _REGISTRY and _REGISTRY[name].source != source:
            raise PlanError(f"two strategies are registered as '{name}': {_REGISTRY[name].source} and {source}")
        if searches:
            def propose(lengths, ctx, search, fn=fn):
                return fn(lengths, ctx, search)
        else:
            def propose(lengths, ctx, search, fn=fn):
                return (Candidate(fn(lengths, ctx)),)
        _REGISTRY[name] = Strategy(name, order, source, propose)
        return fn
    return register


def names() -> Tuple[StrategyName, ...]:
    return tuple(s.name for s in sorted(_REGISTRY.values(), key=lambda s: (s.order, s.name)))


def get_strategy(name: str) -> Strategy:
    if name not in names():
        raise PlanError(f"unknown strategy '{name}' (one of {', '.join(names())})")
    return _REGISTRY[name]


def pick(name: str, lengths: Sequence[int], ctx: PlanContext) -> Tuple[Plan, Candidate]:
    """The Plan of strategy ``name`` (and the candidate it came from): see choose."""
    return choose(name, lengths, ctx, get_strategy(name).propose)


def choose(name: str, lengths: Sequence[int], ctx: PlanContext,
           propose: Callable[[Sequence[int], PlanContext, Search], Iterable[Candidate]]) -> Tuple[Plan, Candidate]:
    """Assemble the proposed candidates and keep the least predicted iteration (ties: the first
    proposed; for Zeppelin the fastest memory-balanced one where that costs little, choice.py);
    a candidate whose bound is at or above the best so far is not assembled. Candidates
    whose assembly raises PlanError (over a set capacity, a remap's linear layout included) are
    skipped; if none is left the last
    error is raised. The winner's label becomes its ``variant``."""
    arr = np.asarray(lengths, dtype=np.int64)
    search, won, errors = Search(lengths=arr, whole_s=ctx.cost.doc_attention_np(arr)), None, []
    memory = MemoryChoice(ctx) if name == StrategyName.ZEPPELIN else None  # Zeppelin's memory balance
    if name == StrategyName.ZEPPELIN:
        search.budget = SearchBudget(ms=ctx.config.plan_budget_ms)
    # A plan up to MEMORY_SLACK slower than the best can still be picked for its memory balance
    reach = 1.0 + (MEMORY_SLACK if memory is not None else 0.0)
    tried: Dict[str, list] = {}  # setting field -> (value, predicted seconds) of each assembled setting
    lower = None  # the batch's lower bound, the same for every candidate (computed at the first)
    ahead: Dict[int, object] = {}  # id of a ``versus`` candidate -> its Plan, None (skipped) or PlanError

    def build(c: Candidate, ref_s: float) -> Optional[Plan]:
        """c's Plan, or None where even its least prediction could not be picked against ref_s
        (beyond ties and the memory slack): a prepared candidate is weighed before it is assembled."""
        nonlocal lower
        if id(c) in ahead:
            got = ahead.pop(id(c))
            if isinstance(got, PlanError):
                raise got
            return got
        moved = None
        if c.prepared is not None and ref_s < float("inf"):
            moved = remapped(ctx, c.placement, c.prepared)  # kept for the assembly
            if faster(reach * ref_s, least_iteration_s(ctx, c.prepared, moved)):
                return None
        lower = lower_bound(search.lengths, ctx.cost, search.whole_s) if lower is None else lower
        return assemble(name, lengths, ctx, c.placement, prepared=c.prepared, lower_bound_s=lower, moved=moved)

    for c in propose(lengths, ctx, search):
        if c.error is not None:  # a setting with no placement
            errors.append((c.setting, c.error))
            continue
        if c.bound >= search.best_s:
            continue
        try:
            ref_s = search.best_s
            if c.versus is not None:  # the later candidate first: this one is weighed against it too
                v = c.versus
                if id(v) not in ahead:
                    try:
                        ahead[id(v)] = build(v, search.best_s)
                    except PlanError as e:
                        ahead[id(v)] = e
                if isinstance(ahead[id(v)], Plan):
                    ref_s = min(ref_s, ahead[id(v)].predicted_iteration_s)
            plan = build(c, ref_s)
        except PlanError as e:
            errors.append((c.setting, e))
            continue
        if plan is None:
            continue
        if c.setting is not None:
            tried.setdefault(c.setting[0], []).append((c.setting[1], plan.predicted_iteration_s))
        if memory is not None:
            memory.offer(plan, c)
        if faster(plan.predicted_iteration_s, search.best_s):
            search.best_s, search.best, won = plan.predicted_iteration_s, plan, c
    if won is None:
        if not errors:
            raise PlanError(f"strategy '{name}' proposed no placement")
        if all(s is not None for s, _ in errors):  # every run-level setting failed: name each
            raise PlanError(f"no feasible {errors[0][0][0]} for this batch: "
                            + "; ".join(f"{s[0]}={s[1]}: {e}" for s, e in errors))
        raise errors[-1][1]
    plan = search.best
    if memory is not None:  # the fastest memory-balanced plan where it costs little (choice.py)
        _, plan, won = memory.pick()
    if won.label:
        plan = replace(plan, meta=replace(plan.meta, variant=won.label))
    if search.budget is not None and search.budget.meta():  # what the search cut (portfolio/budget.py)
        plan = replace(plan, meta=replace(plan.meta, **search.budget.meta()))
    for field, got in tried.items():
        plan = replace(plan, meta=replace(plan.meta, **{field + "_predicted_s": tuple(sorted(got))}))
    return plan, won
