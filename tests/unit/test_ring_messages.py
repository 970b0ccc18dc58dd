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


# An a2a (Ulysses) ring of ranks 0, 1, 2 over the zigzag document above (blocks of 4, 3, 5 tokens),
# 18 bytes of Q and 12 of K/V per token: a step 0 row is a head group's Q/K/V, (18 + 12) / 3 = 10
# bytes; a step 1 row a head group's output, 18 / 3 = 6 bytes. Step 0: member i sends its block i to
# each other member, in ring order from itself (i + 1, i + 2); step 1: each other member sends block
# i's output rows of its heads home to i.
A2A = [  # (step, src, dst, block, tokens, bytes)
    (0, 0, 1, 0, 4, 40), (0, 0, 2, 0, 4, 40), (0, 1, 2, 1, 3, 30), (0, 1, 0, 1, 3, 30),
    (0, 2, 0, 2, 5, 50), (0, 2, 1, 2, 5, 50),
    (1, 0, 1, 1, 3, 18), (1, 0, 2, 2, 5, 30), (1, 1, 0, 0, 4, 24), (1, 1, 2, 2, 5, 30),
    (1, 2, 0, 0, 4, 24), (1, 2, 1, 1, 3, 18),
]


def test_a2a_ring_messages_by_hand():
    ring = Ring(0, (0, 1, 2), "intra", (0,), comm="a2a")
    doc = DocPlan(0, 12, "intra", 0, -1, (0, 1, 3, 6, 8, 9, 12))
    ops = ring_ops([ring], {0: doc}, Topology(1, 4), 12, q_bytes_per_token=18)
    assert [(o.step, o.src, o.dst, o.block, o.stop, o.nbytes) for o in ops] == A2A
    with pytest.raises(ValueError):  # no Q size given: an a2a message has no size
        ring_ops([ring], {0: doc}, Topology(1, 4), 12)


def test_checker_holds_an_a2a_plan_to_its_bytes():
    plan = hand_plan([12, 8], Topology(1, 2), [(0, 1), (0, 1)], comm="a2a")
    assert plan.meta.q_bytes_per_token and {o.step for o in plan.schedule} == {0, 1}
    check_schedule(plan)
    ops = list(plan.schedule)
    for bad in ([replace(ops[0], nbytes=ops[0].nbytes + 1)] + ops[1:],  # bytes off its rows
                [replace(o, nbytes=o.stop * plan.kv_bytes_per_token) for o in ops],  # sized as K/V
                ops[:-1]):  # a message missing
        with pytest.raises(PlanError):
            check_schedule(replace(plan, schedule=tuple(bad)))


# An a2a+p2p ring (TE's hierarchical CP) of ranks 0..3 in a2a groups of 2 (members 0, 1 and 2, 3),
# so a ring of p = 2 groups, over a document of 15 tokens cut into 8 chunks of 1, 2, 3, 1, 2, 1, 3,
# 2: member m holds chunks m and 7 - m, blocks of 3, 5, 4, 3 tokens; group 0's super block is blocks
# 0 and 1 (8 tokens), group 1's blocks 2 and 3 (7). 10 bytes of K/V and 18 of Q per token. Steps 0
# and 1 (= p - 1) are the zigzag ring of the groups, one per head group j: rank (P, j) passes super
# block (P - s) mod 2 (block id super * 2 + j) to rank (P + 1, j), a row half the K/V (5 bytes).
# Step 2 (= p) moves Q/K/V inside each group ((18 + 10) / 2 = 14 bytes a row), step 3 the output
# home (9 bytes a row).
A2A_P2P = [  # (step, src, dst, block, tokens, bytes)
    (0, 0, 2, 0, 8, 40), (0, 1, 3, 1, 8, 40), (0, 2, 0, 2, 7, 35), (0, 3, 1, 3, 7, 35),
    (1, 0, 2, 2, 7, 35), (1, 1, 3, 3, 7, 35), (1, 2, 0, 0, 8, 40), (1, 3, 1, 1, 8, 40),
    (2, 0, 1, 0, 3, 42), (2, 1, 0, 1, 5, 70), (2, 2, 3, 2, 4, 56), (2, 3, 2, 3, 3, 42),
    (3, 0, 1, 1, 5, 45), (3, 1, 0, 0, 3, 27), (3, 2, 3, 3, 3, 27), (3, 3, 2, 2, 4, 36),
]


def test_a2a_p2p_ring_messages_by_hand():
    ring = Ring(0, (0, 1, 2, 3), "inter", (0,), comm="a2a+p2p", a2a=2)
    doc = DocPlan(0, 15, "inter", 0, -1, (0, 1, 3, 6, 7, 9, 10, 13, 15))
    ops = ring_ops([ring], {0: doc}, Topology(2, 2), KVB, q_bytes_per_token=18)
    assert [(o.step, o.src, o.dst, o.block, o.stop, o.nbytes) for o in ops] == A2A_P2P
    with pytest.raises(ValueError):  # groups of 4 in a ring of 4: plain a2a, not a ring of groups
        ring_ops([replace(ring, a2a=4)], {0: doc}, Topology(2, 2), KVB, q_bytes_per_token=18)


def test_checker_holds_an_a2a_p2p_plan_to_its_bytes():
    plan = hand_plan([15, 9, 4], Topology(2, 2), [(0, 1, 2, 3), (0, 1, 2, 3), 1], comm="a2a+p2p", a2a=2)
    assert plan.meta.q_bytes_per_token and {o.step for o in plan.schedule} == {0, 1, 2, 3}
    assert plan.rings[0].a2a == 2 and plan.from_json(plan.to_json()) == plan  # the split survives JSON
    check_schedule(plan)
    ops = list(plan.schedule)
    for bad in ([replace(ops[0], nbytes=ops[0].nbytes * 2)] + ops[1:],  # a whole K/V row, not a head group's
                ops[1:]):  # a message missing
        with pytest.raises(PlanError):
            check_schedule(replace(plan, schedule=tuple(bad)))
