"""A Plan's digest from a compact binary form of its content, not from its JSON.

Every rank compares digests (engine, plan_check) and a rank that receives a Plan from another
checks it (benchmarks/bench_plan_share.py). Rendering the whole Plan as JSON walked every dataclass
field by field and cost 2-3x the planning; here each table of the plan (documents, rings, both
layouts, remap moves, the routed schedule, the costs) is packed column-wise into int64 / float64
arrays with C-level attribute getters and hashed with its shape, so a 16k-document plan digests in
a few milliseconds.

Faithful: every field of every record enters, each table with its length and each variable-length
part (a layout's ranks, a ring's ranks, a document's bounds) with its lengths, so two plans that
differ in any field differ in digest (tests/unit/test_plan_digest.py changes each field in turn).
Words (classes, links, stages, an open set of level names) enter as codes into the plan's own
sorted vocabulary, which is hashed too. Floats enter as their IEEE bytes (a plan and its JSON round
trip, whose floats are exact reprs, digest the same). Deterministic across processes: no Python
``hash``.

>>> from megatron_zeppelin.planner.types import Plan, Thresholds
>>> from megatron_zeppelin.spec.topology import Topology
>>> from megatron_zeppelin.spec.words import StrategyName
>>> p = Plan(StrategyName.PACKED_DP, Topology(1, 1), (3,), (), (), ((),), ((),), (), (), (), 0.0, Thresholds(0, 0))
>>> len(plan_digest(p)), plan_digest(p) == plan_digest(Plan.from_json(p.to_json()))
(16, True)
"""

from __future__ import annotations

import hashlib
import json
from itertools import chain
from operator import attrgetter

import numpy as np

_SEG = attrgetter("doc", "start", "stop")
_DOC = attrgetter("doc", "length", "ring", "owner", "padded")
_RING = attrgetter("id", "a2a")
_OP_INTS = attrgetter("step", "ring", "block", "msg_src", "msg_dst", "src", "dst", "start", "stop", "nbytes", "nic")
_COST = attrgetter("attention_s", "linear_s", "comm_exposed_s", "remap_s")
_I8 = np.dtype("<i8")
_F8 = np.dtype("<f8")


class _Hasher:
    def __init__(self):
        self.h = hashlib.sha256()

    def text(self, tag: str, s: str) -> None:
        b = s.encode()
        self.h.update(f"{tag}:{len(b)}:".encode())
        self.h.update(b)

    def ints(self, tag: str, rows, width: int) -> None:
        """Rows of ``width`` ints (tuples from an attrgetter, or ints when width is 1)."""
        flat = rows if width == 1 else chain.from_iterable(rows)
        a = np.fromiter(flat, dtype=_I8)
        self.h.update(f"{tag}:{width}:{a.size}:".encode())
        self.h.update(a.tobytes())

    def floats(self, tag: str, values) -> None:
        a = np.fromiter(values, dtype=_F8)
        self.h.update(f"{tag}:{a.size}:".encode())
        self.h.update(a.tobytes())

    def words(self, tag: str, values) -> None:
        """Words (StrEnum members or plain strings) as codes into their sorted vocabulary."""
        values = [str(v) for v in values]
        vocab = sorted(set(values))
        code = {w: i for i, w in enumerate(vocab)}
        self.text(tag + ".vocab", json.dumps(vocab))
        self.ints(tag, map(code.__getitem__, values), 1)

    def segments(self, tag: str, groups) -> None:
        """Per-group segment lists (a layout's ranks, the remap's moves): the lengths, then the rows."""
        self.ints(tag + ".n", map(len, groups), 1)
        self.ints(tag, map(_SEG, chain.from_iterable(groups)), 3)


def plan_digest(plan) -> str:
    """16 hex digits of SHA-256 over the plan's binary form (see the module's docstring)."""
    h = _Hasher()
    h.text("head", json.dumps([str(plan.strategy), plan.topology.to_dict(), plan.thresholds.local_max,
                               plan.thresholds.intra_max, plan.thresholds.reason, plan.kv_bytes_per_token,
                               [list(p) for p in plan.meta.pairs()]]))
    h.floats("scalars", (plan.lower_bound_s, plan.allreduce_s))
    h.ints("lengths", plan.lengths, 1)
    docs = plan.docs
    h.ints("docs", map(_DOC, docs), 5)
    h.words("docs.cls", (d.cls for d in docs))
    h.ints("docs.bounds.n", (len(d.bounds) for d in docs), 1)
    h.ints("docs.bounds", chain.from_iterable(d.bounds for d in docs), 1)
    rings = plan.rings
    h.ints("rings", map(_RING, rings), 2)
    h.words("rings.cls", (r.cls for r in rings))
    h.words("rings.comm", (r.comm for r in rings))
    for part in ("ranks", "docs"):
        get = attrgetter(part)
        h.ints(f"rings.{part}.n", (len(get(r)) for r in rings), 1)
        h.ints(f"rings.{part}", chain.from_iterable(map(get, rings)), 1)
    h.segments("attention_layout", plan.attention_layout)
    h.segments("linear_layout", plan.linear_layout)
    h.ints("remap", ((m.src, m.dst) for m in plan.remap), 2)
    h.segments("remap.segments", [m.segments for m in plan.remap])
    ops = plan.schedule
    h.ints("schedule", map(_OP_INTS, ops), 11)
    h.words("schedule.queue", (o.queue for o in ops))
    h.words("schedule.link", (o.link for o in ops))
    h.words("schedule.stage", (o.stage for o in ops))
    h.floats("cost", chain.from_iterable(map(_COST, plan.cost)))
    return h.h.hexdigest()[:16]
