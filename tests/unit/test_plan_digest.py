"""Plan.digest is a faithful digest of the plan's content: any one field changed, anywhere in the plan
(a top-level scalar, one document's bound, one segment of one rank's layout, one routed op's link,
one rank's cost, the metadata), changes it; equal plans (a JSON or pickle round trip) keep it."""

import dataclasses
import pickle
from enum import Enum

import pytest

from megatron_zeppelin.planner import plan_batch
from megatron_zeppelin.planner.plan_digest import plan_digest
from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE
from megatron_zeppelin.planner.types import Move, Plan, Segment
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.topology import Topology


@pytest.fixture(scope="module")
def plan():
    # a long document across both nodes: inter rings, a routed schedule, and a remap
    p = plan_batch([12000, 5000, 4000, 300, 200, 100, 90000], Topology(2, 4, 2), TOY_PROFILE, TOY_MODEL,
                   ZeppelinConfig(gpus_per_node=4))
    assert p.rings and p.schedule and any(len(d.bounds) > 2 for d in p.docs)
    if not p.remap:  # the digest reads fields, it does not check them: two moves so every table is filled
        p = dataclasses.replace(p, remap=(Move(0, 1, (Segment(3, 0, 100), Segment(4, 0, 50))),
                                          Move(2, 5, (Segment(5, 10, 90),))))
    return p


def _leaf_variants(v):
    if isinstance(v, bool):
        return [not v]
    if isinstance(v, Enum):
        return [m for m in type(v) if m != v]
    if isinstance(v, str):
        return [v + "x"]
    if isinstance(v, int):
        return [v + 1]
    if isinstance(v, float):
        return [v * 1.5 + 1e-9]
    return []


def variants(x, depth=0):
    """Copies of ``x`` that differ from it in one place each: every field of a dataclass, the first and
    last element of a tuple (and the tuple one shorter), every leaf value changed."""
    if dataclasses.is_dataclass(x):
        for f in dataclasses.fields(x):
            for v in variants(getattr(x, f.name), depth + 1):
                try:
                    yield dataclasses.replace(x, **{f.name: v})
                except (ValueError, TypeError):  # a value its type refuses (validation)
                    continue
    elif isinstance(x, tuple):
        if x:
            yield x[:-1]
            for i in sorted({0, len(x) - 1}):
                for v in variants(x[i], depth + 1):
                    yield x[:i] + (v,) + x[i + 1:]
    else:
        yield from _leaf_variants(x)


def test_any_one_field_changed_changes_the_digest(plan):
    base = plan.digest()
    seen = 0
    for other in variants(plan):
        if other == plan:
            continue
        assert plan_digest(other) != base, plan.first_difference(other) or repr(other)
        seen += 1
    assert seen > 100  # every table of the plan was reached


def test_equal_plans_share_the_digest_and_it_is_kept(plan):
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.digest() == plan.digest() == plan_digest(plan)
    got = pickle.loads(pickle.dumps(plan))
    assert "_derived" not in got.__dict__  # a receiver hashes what it received
    assert got.digest() == plan.digest()
    assert plan.digest() is plan.digest()  # computed once per plan object
