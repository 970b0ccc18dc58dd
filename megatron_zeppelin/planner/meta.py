"""PlanMeta: why a strategy made its plan (its choices and what it predicted for the others).

Read by reports and tests, never by the engine or the simulator. Typed fields, one per fact a
strategy records; a strategy notes them as text in ``Placement.meta`` and assembly types them
(an unknown name is an error, so a misspelt note cannot slip through). The JSON form is the one
plans have always had, the sorted ``[name, text]`` pairs of the fields that are set, so plan
digests do not change; iterating a PlanMeta gives those pairs (``dict(plan.meta)``).

>>> m = PlanMeta.from_pairs([("cp_size", "4"), ("cp_size_predicted_s", "2:0.5, 4:0.25"), ("dp_size", "2")])
>>> m.cp_size, m.cp_size_predicted_s, m.variant
(4, ((2, 0.5), (4, 0.25)), '')
>>> m.pairs()
(('cp_size', '4'), ('cp_size_predicted_s', '2:0.5, 4:0.25'), ('dp_size', '2'))
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterable, Iterator, Optional, Tuple

from megatron_zeppelin.planner.errors import PlanError
from megatron_zeppelin.spec.recompute import Recompute

Tried = Tuple[Tuple[int, float], ...]  # (run-level value, predicted iteration seconds), by value


@dataclass(frozen=True)
class PlanMeta:
    # Zeppelin (partition.py): the winning variant (rate/inter/rings/remap, or shape/remap), the
    # baseline shape it took when one won (candidates.py), its greedy's budget, budget scale and estimate.
    variant: str = ""
    shape: str = ""
    budget_s: Optional[float] = None
    target: Optional[float] = None
    estimate_s: Optional[float] = None
    # Zeppelin's search (portfolio/budget.py): the fixed shapes skipped for their lower bound, and
    # the candidates skipped for --zeppelin-plan-budget-ms (unset: none).
    cut_bound: str = ""
    cut_budget: str = ""
    # With --zeppelin-balance-memory (memory_choice.plan_memory_first): the per-rank token cap it was
    # planned under (unset: none, or no plan fit under it).
    token_cap: Optional[int] = None
    # Fixed-CP baselines (static_cp, allgather_cp): the CP size, DP replicas, each size's prediction.
    cp_size: Optional[int] = None
    dp_size: Optional[int] = None
    cp_size_predicted_s: Tried = ()
    a2a_cp_size_predicted_s: Tried = ()  # static_cp: each a2a (Ulysses) CP size's prediction
    # static_cp in TE's a2a+p2p: Megatron's --hierarchical-context-parallel-sizes ("a p"), and each
    # tried split's prediction by its "AxP" label
    hierarchical_cp_sizes: str = ""
    a2a_p2p_predicted_s: Tuple[Tuple[str, float], ...] = ()
    # dynamic_cp: Megatron's max_seqlen_per_dp_cp_rank (and each tried value), its HDP rounds.
    max_seqlen_per_dp_cp_rank: Optional[int] = None
    max_seqlen_per_dp_cp_rank_predicted_s: Tried = ()
    hdp_rounds: Optional[int] = None
    hdp_round: Optional[int] = None
    # CP baselines: the multiple TE / Megatron pad each document to (planner/build/padding.py)
    pad_multiple: Optional[int] = None
    # hybrid_dp: the FLOPs share that sizes its groups.
    flops_share: Optional[float] = None
    # Every strategy: the activation recompute the plan is priced with (spec/recompute.py; unset = none),
    # which the simulator runs again before each backward (sim/iteration.plan_recompute); its text
    # form ("selective:core_attn") only in the JSON pairs.
    recompute: Optional[Recompute] = None
    # Plans with a2a rings: bytes of Q per token and TP rank, which size their messages
    # (build/schedule.row_bytes; the schedule check reads it).
    q_bytes_per_token: Optional[int] = None

    def __post_init__(self):  # floats as their text says: a plan equals its JSON round trip
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None and v != "" and v != ():
                object.__setattr__(self, f.name, _parse(f.name, _text(f.name, v)))

    @classmethod
    def from_pairs(cls, pairs: Iterable[Tuple[str, str]]) -> "PlanMeta":
        known = {f.name for f in fields(cls)}
        out = {}
        for k, v in pairs:
            if k not in known:
                raise PlanError(f"unknown plan metadata '{k}' (PlanMeta fields: {', '.join(sorted(known))})")
            out[k] = _parse(k, str(v))
        return cls(**out)

    def pairs(self) -> Tuple[Tuple[str, str], ...]:
        """(name, text) of every field that is set, sorted by name: the JSON form."""
        return tuple(sorted((f.name, _text(f.name, getattr(self, f.name))) for f in fields(self)
                            if getattr(self, f.name) not in (None, "", ())))

    def __iter__(self) -> Iterator[Tuple[str, str]]:
        return iter(self.pairs())

    def __repr__(self) -> str:  # the fields that are set
        return "PlanMeta(" + ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                                       if getattr(self, f.name) not in (None, "", ())) + ")"


_INTS = ("token_cap", "cp_size", "dp_size", "max_seqlen_per_dp_cp_rank", "hdp_rounds", "hdp_round",
         "q_bytes_per_token", "pad_multiple")
_FLOATS = {"budget_s": ".6g", "estimate_s": ".6g", "flops_share": ".6g", "target": "g"}  # as strategies write them
_TRIED = ("cp_size_predicted_s", "a2a_cp_size_predicted_s", "max_seqlen_per_dp_cp_rank_predicted_s",
          "a2a_p2p_predicted_s")
_TEXT_LABELS = ("a2a_p2p_predicted_s",)  # tried values named by text ("AxP"), not numbers


def _text(name: str, v) -> str:
    if name == "recompute":
        return Recompute.parse(v).describe()
    if name in _TRIED:
        return ", ".join(f"{lb}:{t:.6g}" for lb, t in v)
    if name in _FLOATS:
        return format(float(v), _FLOATS[name])
    return str(v)


def _parse(name: str, s: str):
    if name == "recompute":
        return Recompute.parse(s)
    if name in _TRIED:
        label = str if name in _TEXT_LABELS else int
        return tuple((label(lb), float(t)) for lb, t in (x.strip().split(":") for x in s.split(",")))
    if name in _FLOATS:
        return float(s)
    if name in _INTS:
        return int(s)
    return s
