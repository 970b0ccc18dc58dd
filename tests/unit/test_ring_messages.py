"""The ring schedule against hand-written tables: who sends which K/V block at which step, and the
checker (planner/build/checks.py) accepting exactly that schedule. The expected rows are written out
here by hand from the zigzag and all-gather rules, not computed by the loop of ring_messages."""

from dataclasses import replace

import pytest

from megatron_zeppelin.planner.build.checks import check_schedule
from megatron_zeppelin.planner.build.schedule import ring_ops
from megatron_zeppelin.planner.types import DocPlan, PlanError, Ring
from megatron_zeppelin.attention.testing import hand_plan
from megatron_zeppelin.spec.topology import Topology

KVB = 10  # bytes of K/V per token

# A 3-member zigzag ring (ranks 0, 1, 2) over one document of 12 tokens cut into 6 chunks of
# 1, 2, 3, 2, 1, 3 tokens: member i holds chunks i and 5 - i, so blocks of 1+3 = 4, 2+1 = 3 and
# 3+2 = 5 tokens. At step s member i sends the block it holds, (i - s) mod 3, to member i + 1.
ZIGZAG = [  # (step, src, dst, block, tokens)
    (0, 0, 1, 0, 4), (0, 1, 2, 1, 3), (0, 2, 0, 2, 5),
    (1, 0, 1, 2, 5), (1, 1, 2, 0, 4), (1, 2, 0, 1, 3),
    (2, 0, 1, 1, 3), (2, 1, 2, 2, 5), (2, 2, 0, 0, 4),  # step 2 (backward only): each dK/dV home
]

# An all-gather ring of ranks 0 and 2 on two nodes of 2 GPUs with one NIC each, over a document of
# 6 tokens cut 1, 2, 1, 2: member 0 holds chunks 0 and 3 (3 tokens), member 1 chunks 1 and 2 (3).
ALLGATHER = [(0, 0, 2, 0, 3, "nic", 0), (0, 2, 0, 1, 3, "nic", 1)]  # (step, src, dst, block, tokens, link, nic)


def test_zigzag_ring_messages_by_hand():
    ring = Ring(0, (0, 1, 2), "intra", (0,))
    doc = DocPlan(0, 12, "intra", 0, -1, (0, 1, 3, 6, 8, 9, 12))
    ops = ring_ops([ring], {0: doc}, Topology(1, 4), KVB)
    got = [(o.step, o.src, o.dst, o.block, o.stop) for o in ops]
    assert got == ZIGZAG
    assert all(o.nbytes == o.stop * KVB and o.start == 0 and o.link == "nvlink" and o.nic == -1
               and o.stage == "direct" and (o.msg_src, o.msg_dst) == (o.src, o.dst) for o in ops)


def test_allgather_ring_messages_by_hand():
    ring = Ring(0, (0, 2), "inter", (0,), comm="allgather")
    doc = DocPlan(0, 6, "inter", 0, -1, (0, 1, 3, 4, 6))
    ops = ring_ops([ring], {0: doc}, Topology(2, 2, 1), KVB)
    assert [(o.step, o.src, o.dst, o.block, o.stop, o.link, o.nic) for o in ops] == ALLGATHER


def test_checker_holds_a_plan_to_the_hand_table():
    plan = hand_plan([12], Topology(1, 3), [(0, 1, 2)])
    doc = plan.docs[0]
    sizes = [doc.bounds[i + 1] - doc.bounds[i] + doc.bounds[6 - i] - doc.bounds[5 - i] for i in range(3)]
    # the hand rule on this plan's own chunking: block b travels at step s from member (b + s) mod 3
    want = sorted((s, (b + s) % 3, (b + s + 1) % 3, b, sizes[b]) for s in range(3) for b in range(3) if sizes[b])
    assert sorted((o.step, o.src, o.dst, o.block, o.stop) for o in plan.schedule) == want
    check_schedule(plan)
    ops = list(plan.schedule)
    for bad in (ops[:-1],  # a message missing
                ops[:1] + [replace(ops[1], block=(ops[1].block + 1) % 3)] + ops[2:],  # the wrong block
                [replace(o, dst=o.src, src=o.dst) if i == 0 else o for i, o in enumerate(ops)]):  # reversed
        with pytest.raises(PlanError):
            check_schedule(replace(plan, schedule=tuple(bad)))
