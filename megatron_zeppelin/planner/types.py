"""The Plan: the one contract between planning, execution and simulation.

Every strategy (Zeppelin and the baselines) returns a Plan; the engine executes it and the
simulator times it. It is plain frozen data with a JSON form and a digest that every rank compares.

Worked example: 2 ranks on one node, documents of 6 and 3 tokens; document 0 on an intra ring
of both ranks (4 zigzag chunks), document 1 local on rank 1.

>>> d0 = DocPlan(doc=0, length=6, cls="intra", ring=0, owner=-1, bounds=(0, 1, 3, 4, 6))
>>> d0.member_segments(0), d0.member_segments(1)   # member i holds chunks i and 2G-1-i
((Segment(doc=0, start=0, stop=1), Segment(doc=0, start=4, stop=6)), (Segment(doc=0, start=1, stop=3), Segment(doc=0, start=3, stop=4)))
>>> DocPlan(doc=1, length=3, cls="local", ring=-1, owner=1, bounds=(0, 3)).member_segments(0)
(Segment(doc=1, start=0, stop=3),)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, is_dataclass
from enum import StrEnum
from functools import cached_property
from operator import attrgetter
from typing import Dict, Iterable, List, Optional, Tuple, Union

from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.spec.words import CLASSES, LINKS, Comm, DocClass, Layout, Link, Stage, StrategyName
from megatron_zeppelin.planner.errors import PlanError  # noqa: F401 (re-exported: its users import it from here)
from megatron_zeppelin.planner.meta import PlanMeta
from megatron_zeppelin.planner.plan_digest import plan_digest


@dataclass(frozen=True, order=True)
class Segment:
    """Tokens [start, stop) of document ``doc`` (positions inside the document, for RoPE)."""
    doc: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


_START, _STOP = attrgetter("start"), attrgetter("stop")


def segment_tokens(segments: Iterable["Segment"]) -> int:
    """Tokens of some segments, summed in C (plans of 16k documents sum ~100k segments a layout).

    >>> segment_tokens([Segment(0, 2, 5), Segment(1, 0, 4)])
    7
    """
    segments = segments if isinstance(segments, (tuple, list)) else list(segments)
    return sum(map(_STOP, segments)) - sum(map(_START, segments))


@dataclass(frozen=True)
class DocPlan:
    """Where one document runs. ``bounds`` has 2G+1 chunk boundaries for a ring of G members
    (chunk j = tokens [bounds[j], bounds[j+1]); member i holds chunks i and 2G-1-i), or (0, L) local."""
    doc: int
    length: int
    cls: DocClass
    ring: int  # index into Plan.rings, -1 for local
    owner: int  # rank for local documents, -1 otherwise
    bounds: Tuple[int, ...]
    # The length the real system pads this document to (TE's THD CP: a multiple of 2 x cp; Megatron's
    # dynamic CP: of 2 x DP x CP; planner/build/padding.py), 0 when it runs unpadded. The pad rows are
    # charged (prediction, simulation, memory: ``charged``), never run: the engine runs the real rows.
    # 0 is left out of the JSON, so plans without padding keep their digests.
    padded: int = 0

    def charged(self) -> "DocPlan":
        """This document as the padded system holds it: ``padded`` tokens in 2G equal chunks (the pad
        rows at its end, as TE's cu_seqlens_padded put them); itself when unpadded.

        >>> DocPlan(0, 13, DocClass.INTRA, 0, -1, (0, 3, 6, 9, 13), padded=16).charged().bounds
        (0, 4, 8, 12, 16)
        """
        if not self.padded:
            return self
        n = len(self.bounds) - 1
        return DocPlan(self.doc, self.padded, self.cls, self.ring, self.owner,
                       tuple([j * self.padded // n for j in range(n + 1)]), self.padded)

    def member_segments(self, member: int) -> Tuple[Segment, ...]:
        if self.ring < 0:
            return (Segment(self.doc, 0, self.length),)
        g2 = len(self.bounds) - 1
        a, b = member, g2 - 1 - member
        return tuple(Segment(self.doc, self.bounds[j], self.bounds[j + 1]) for j in (a, b)
                     if self.bounds[j + 1] > self.bounds[j])


@dataclass(frozen=True)
class Ring:
    """Ranks that run ring attention together on ``docs`` (in this order). ``comm`` is ``p2p``
    (zigzag ring: K/V blocks travel around the ring) or ``allgather`` (Llama-3-style)."""
    id: int
    ranks: Tuple[int, ...]
    cls: DocClass
    docs: Tuple[int, ...]
    comm: Comm = Comm.P2P
    # a2a+p2p rings: the ranks of one all-to-all group (consecutive members, TE's cp_group[0]); the
    # ring of groups has size // a2a members. 1 for every other kind (left out of the JSON then,
    # so plans without such rings keep their digests).
    a2a: int = 1

    @property
    def size(self) -> int:
        return len(self.ranks)


def ring_documents(docs, rings) -> Dict[int, DocPlan]:
    """The DocPlans of the rings' documents, by id (what the layout, the schedule and the prices read):
    looked up by position where ``docs`` holds document k at index k (a Plan's documents: a few ring
    documents among thousands need no scan of them all), else by a scan.

    >>> docs = [DocPlan(0, 4, DocClass.INTRA, 0, -1, (0, 1, 2, 3, 4)), DocPlan(1, 3, DocClass.LOCAL, -1, 0, (0, 3))]
    >>> ring = Ring(0, (0, 1), DocClass.INTRA, (0,))
    >>> ring_documents(docs, [ring]) == ring_documents(docs[::-1], [ring]) == {0: docs[0]}
    True
    """
    n, out = len(docs), {}
    for r in rings:
        for i in r.docs:
            d = docs[i] if 0 <= i < n else None
            if d is None or d.doc != i:
                return {d.doc: d for d in docs if d.ring >= 0}
            out[i] = d
    return out


@dataclass(frozen=True)
class Move:
    """Remap, forward direction (attention layout -> linear layout): ``src`` sends ``segments``
    to ``dst``. The backward (and the linear -> attention remap) is the same move reversed."""
    src: int
    dst: int
    segments: Tuple[Segment, ...]

    @cached_property  # read several times per move by every prediction (in __dict__, not a field)
    def tokens(self) -> int:
        return segment_tokens(self.segments)


@dataclass(frozen=True)
class CommOp:
    """One hop of one ring-step message in one attention layer's forward.

    The message is the K/V block that ring member ``block`` owns (all its tokens of the ring's
    documents, in attention-layout order) travelling from ``msg_src`` to ``msg_dst``; this op carries
    its token rows [start, stop) from ``src`` to ``dst`` over ``link`` (``nic`` = global NIC id for a
    NIC hop, else -1). Stages of a step run in STAGES order: direct sends, or dispatch -> transfer ->
    combine for a routed message. Ring steps 0..G-2 carry K/V in the forward; the backward also
    uses step G-1 (dK/dV return to their owner)."""
    queue: DocClass  # inter or intra
    step: int
    ring: int
    block: int  # ring member index whose K/V this is
    msg_src: int
    msg_dst: int
    src: int
    dst: int
    start: int
    stop: int
    nbytes: int
    link: Union[Link, str]  # a Link, or the name of a profile level above the NIC's (an open set: YAML)
    nic: int
    stage: Stage


@dataclass(frozen=True)
class RankCost:
    """Predicted seconds for one training iteration (forward + backward, all layers) on one rank."""
    attention_s: float
    linear_s: float
    comm_exposed_s: float
    remap_s: float

    @property
    def total_s(self) -> float:
        return self.attention_s + self.linear_s + self.comm_exposed_s + self.remap_s


@dataclass(frozen=True)
class Thresholds:
    """Length classes: <= local_max stays local; > intra_max may span nodes. ``reason`` says why."""
    local_max: int
    intra_max: int
    reason: str = ""


@dataclass(frozen=True)
class Plan:
    strategy: StrategyName
    topology: Topology
    lengths: Tuple[int, ...]
    docs: Tuple[DocPlan, ...]
    rings: Tuple[Ring, ...]  # queue order: inter rings, then intra rings
    attention_layout: Tuple[Tuple[Segment, ...], ...]  # per rank
    linear_layout: Tuple[Tuple[Segment, ...], ...]  # per rank
    remap: Tuple[Move, ...]
    schedule: Tuple[CommOp, ...]
    cost: Tuple[RankCost, ...]
    lower_bound_s: float
    thresholds: Thresholds
    kv_bytes_per_token: int = 0
    meta: PlanMeta = field(default_factory=PlanMeta)  # why the strategy chose it (meta.py)
    # The DP gradient all-reduce after the backward (Megatron's default, not overlapped): the same
    # for every strategy, so not in ``cost`` / ``predicted_iteration_s``; the simulator adds it too.
    allreduce_s: float = 0.0

    # --- derived views ------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.topology.world_size

    @property
    def predicted_iteration_s(self) -> float:
        return max(c.total_s for c in self.cost)

    @property
    def predicted_with_allreduce_s(self) -> float:
        """The iteration as the simulator times it by default: the slowest rank, then the DP all-reduce."""
        return self.predicted_iteration_s + self.allreduce_s

    @property
    def imbalance(self) -> float:
        t = [c.total_s for c in self.cost]
        mean = sum(t) / len(t)
        return max(t) / mean if mean > 0 else 1.0

    def tokens(self, rank: int, layout: Layout = Layout.ATTENTION) -> int:
        lay = self.attention_layout if Layout(layout) == Layout.ATTENTION else self.linear_layout
        return sum(len(s) for s in lay[rank])

    def rings_of(self, rank: int, cls: Optional[str] = None) -> Tuple[Ring, ...]:
        return tuple(r for r in self.rings if rank in r.ranks and (cls is None or r.cls == cls))

    def local_docs(self, rank: int) -> Tuple[DocPlan, ...]:
        local = DocClass.LOCAL  # bound once (spec/words.py)
        return tuple(d for d in self.docs if d.cls == local and d.owner == rank)

    def ops(self, queue: Optional[str] = None, step: Optional[int] = None) -> Tuple[CommOp, ...]:
        return tuple(o for o in self.schedule
                     if (queue is None or o.queue == queue) and (step is None or o.step == step))

    def __getstate__(self):  # a pickled plan carries its contract, not its derived views
        d = dict(self.__dict__)
        d.pop("_derived", None)
        return d

    def derived(self, key, build):
        """A view derived from this plan (a rank's remap index, ...), built once and kept with the
        plan, so it lives exactly as long as the plan does. Not part of the contract: not compared,
        serialised or digested.

        >>> p = Plan(StrategyName.PACKED_DP, Topology(1, 1), (), (), (), ((),), ((),), (), (), (), 0.0, Thresholds(0, 0))
        >>> p.derived("n", lambda: [1]) is p.derived("n", lambda: [2])
        True
        """
        memo = self.__dict__.setdefault("_derived", {})  # frozen: only the fields are immutable
        if key not in memo:
            memo[key] = build()
        return memo[key]

    def class_counts(self) -> Dict[str, int]:
        out = {c: 0 for c in CLASSES}
        for d in self.docs:
            out[d.cls] += 1
        return out

    # --- JSON and digest ----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return _encode(self)

    def to_json(self, indent: Optional[int] = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, separators=None if indent else (",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        try:
            return Plan(
                strategy=StrategyName(d["strategy"]), topology=Topology.from_dict(d["topology"]),
                lengths=tuple(d["lengths"]),
                docs=tuple(DocPlan(**{**x, "cls": DocClass(x["cls"]), "bounds": tuple(x["bounds"])}) for x in d["docs"]),
                rings=tuple(Ring(**{**x, "cls": DocClass(x["cls"]), "comm": Comm(x.get("comm", Comm.P2P)),
                                    "ranks": tuple(x["ranks"]), "docs": tuple(x["docs"])}) for x in d["rings"]),
                attention_layout=tuple(tuple(Segment(*s) for s in r) for r in d["attention_layout"]),
                linear_layout=tuple(tuple(Segment(*s) for s in r) for r in d["linear_layout"]),
                remap=tuple(Move(m["src"], m["dst"], tuple(Segment(*s) for s in m["segments"]))
                            for m in d["remap"]),
                schedule=tuple(_op(o) for o in d["schedule"]),
                cost=tuple(RankCost(*c) for c in d["cost"]),
                lower_bound_s=float(d["lower_bound_s"]), thresholds=Thresholds(**d["thresholds"]),
                kv_bytes_per_token=int(d.get("kv_bytes_per_token", 0)),
                meta=PlanMeta.from_pairs(d.get("meta", [])),
                allreduce_s=float(d.get("allreduce_s", 0.0)))
        except (KeyError, TypeError, ValueError) as e:  # ValueError: a word outside its set
            raise PlanError(f"malformed plan JSON: {e}") from None

    @classmethod
    def from_json(cls, s: str) -> "Plan":
        return cls.from_dict(json.loads(s))

    def digest(self) -> str:
        """16 hex digits over the plan's content in a compact binary form (plan_digest.py: every field
        enters; no JSON rendering), computed once per plan object (not pickled: a receiver's check
        hashes what it received)."""
        return self.derived("digest", lambda: plan_digest(self))

    def first_difference(self, other: "Plan") -> Optional[str]:
        """Path of the first field where two plans differ (None if equal), for mismatch errors."""
        return _first_diff(self.to_dict(), other.to_dict(), "plan")


def _op(o) -> CommOp:
    """A CommOp from its JSON list, its words as members (a level above the NIC's keeps its name)."""
    link = o[11]
    return CommOp(DocClass(o[0]), *o[1:11], Link(link) if link in LINKS else link, o[12], Stage(o[13]))


# Compact encodings: segments and ops are lists (they are many); other dataclasses are dicts.
_AS_LIST = (Segment, CommOp, RankCost)


def _encode(x):
    if isinstance(x, PlanMeta):  # its [name, text] pairs: the form plans always had
        return [list(p) for p in x.pairs()]
    if isinstance(x, _AS_LIST):
        return [_encode(getattr(x, f.name)) for f in fields(x)]
    if isinstance(x, Topology):
        return x.to_dict()
    if is_dataclass(x):
        return {f.name: _encode(getattr(x, f.name)) for f in fields(x)
                if not ((f.name == "a2a" and isinstance(x, Ring) and x.a2a == 1)
                        or (f.name == "padded" and isinstance(x, DocPlan) and not x.padded))}
    if isinstance(x, (tuple, list)):
        return [_encode(v) for v in x]
    if isinstance(x, StrEnum):  # the plain word, so a plan and its JSON round trip compare equal
        return x.value
    if isinstance(x, float):
        return float(repr(float(x))) if x == x else None  # float(): numpy floats repr as np.float64(...)
    return x


def _first_diff(a, b, path: str) -> Optional[str]:
    if type(a) != type(b):
        return path
    if isinstance(a, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                return f"{path}.{k}"
            r = _first_diff(a[k], b[k], f"{path}.{k}")
            if r:
                return r
        return None
    if isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b)):
            r = _first_diff(x, y, f"{path}[{i}]")
            if r:
                return r
        return f"{path} (length {len(a)} vs {len(b)})" if len(a) != len(b) else None
    return None if a == b else path


def cu_seqlens(segs: Iterable[Segment]) -> List[int]:
    """Cumulative lengths of consecutive segments (the varlen kernels' ``cu_seqlens``).

    >>> cu_seqlens([Segment(0, 0, 3), Segment(4, 0, 5)])
    [0, 3, 8]
    """
    out = [0]
    for s in segs:
        out.append(out[-1] + len(s))
    return out
