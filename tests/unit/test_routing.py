"""Routing layer planner: routed pieces deliver exactly the rows of each direct message, over
same-rail NIC hops, never more pieces than NICs, balanced over idle NICs, deterministic."""

import math
import random
from collections import defaultdict

import pytest
from hypothesis import given, settings, strategies as st

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner.build.assemble import assemble
from megatron_zeppelin.planner.build.checks import check_plan
from megatron_zeppelin.planner.context import Placement
from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.planner.build.layout import zigzag_bounds
from megatron_zeppelin.planner.cost.predict import step_message_times
from megatron_zeppelin.planner.build.routing import (NEVER, explain_step, nic_bytes, route_schedule,
                                               route_threshold_bytes)
from megatron_zeppelin.planner.build.schedule import ring_ops
from megatron_zeppelin.planner.testing import toy_context
from megatron_zeppelin.planner.types import CommOp, DocPlan, Ring, Thresholds
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.topology import Topology

KVB = 8
CFG = ZeppelinConfig(min_route_bytes=16)


def direct(topo, src, dst, rows, ring=0, block=0, step=0, queue="inter"):
    return CommOp(queue, step, ring, block, src, dst, src, dst, 0, rows, rows * KVB, "nic", topo.nic_of(src),
                  "direct")


def check_routed(before, after, topo):
    """Every message's rows arrive exactly once at msg_dst, each piece via a well-formed chain."""
    msgs = {(o.queue, o.step, o.ring, o.block, o.msg_src, o.msg_dst): o for o in before}
    assert len(msgs) == len(before)
    by_msg = defaultdict(list)
    for o in after:
        by_msg[(o.queue, o.step, o.ring, o.block, o.msg_src, o.msg_dst)].append(o)
    assert set(by_msg) == set(msgs)
    for key, ops in by_msg.items():
        m = msgs[key]
        per_row = m.nbytes // (m.stop - m.start)
        for o in ops:
            assert o.nbytes == (o.stop - o.start) * per_row
            assert (o.link == "nic") == (not topo.same_node(o.src, o.dst))
            assert o.nic == (topo.nic_of(o.src) if o.link == "nic" else -1)
        if len(ops) == 1 and ops[0].stage == "direct":
            assert ops[0] == m
            continue
        transfers = sorted((o for o in ops if o.stage == "transfer"), key=lambda o: o.start)
        assert [o.stage for o in ops if o.stage not in ("dispatch", "transfer", "combine")] == []
        assert len(transfers) <= topo.nics_per_node
        assert len({o.nic for o in transfers}) == len(transfers)  # one piece per NIC
        rows = [(o.start, o.stop) for o in transfers]  # pieces tile the message's rows
        assert rows[0][0] == m.start and rows[-1][1] == m.stop
        assert all(a[1] == b[0] for a, b in zip(rows, rows[1:]))
        for t in transfers:
            # same rail: sender's NIC index == receiver's NIC index
            assert topo.gpu_to_nic[topo.local_of(t.src)] == topo.gpu_to_nic[topo.local_of(t.dst)]
            assert topo.node_of(t.src) == topo.node_of(m.msg_src) and topo.node_of(t.dst) == topo.node_of(m.msg_dst)
            d = [o for o in ops if o.stage == "dispatch" and (o.start, o.stop) == (t.start, t.stop)]
            c = [o for o in ops if o.stage == "combine" and (o.start, o.stop) == (t.start, t.stop)]
            assert (d == []) == (t.src == m.msg_src) and (c == []) == (t.dst == m.msg_dst)
            assert all(o.src == m.msg_src and o.dst == t.src for o in d)
            assert all(o.src == t.dst and o.dst == m.msg_dst for o in c)
        assert len(ops) == len(transfers) + sum(o.stage in ("dispatch", "combine") for o in ops)


@st.composite
def steps(draw):
    nodes = draw(st.integers(2, 4))
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    nics = draw(st.sampled_from([n for n in (1, 2, 4, 8) if n <= gpus and gpus % n == 0]))
    topo = Topology(nodes, gpus, nics)
    ops = []
    for m in range(draw(st.integers(1, 6))):
        src = draw(st.integers(0, topo.world_size - 1))
        dst = draw(st.sampled_from([r for r in range(topo.world_size) if not topo.same_node(r, src)]))
        ops.append(direct(topo, src, dst, draw(st.integers(1, 40)), ring=m, step=draw(st.integers(0, 1))))
    return topo, ops


@settings(max_examples=150, deadline=None)
@given(steps(), st.integers(0, 3))
def test_routed_pieces_deliver_every_row_once(case, seed):
    topo, ops = case
    routed = route_schedule(ops, topo, None, CFG)
    check_routed(ops, routed, topo)
    shuffled = list(ops)
    random.Random(seed).shuffle(shuffled)
    assert route_schedule(shuffled, topo, None, CFG) == routed  # deterministic, order-free


@pytest.mark.parametrize("nodes,gpus,nics", [(2, 8, 8), (2, 8, 4), (3, 4, 2), (2, 4, 4)])
@pytest.mark.parametrize("rows", [1, 7, 8, 1000, 4099])
def test_largest_share_on_idle_nics(nodes, gpus, nics, rows):
    topo = Topology(nodes, gpus, nics)
    op = direct(topo, gpus - 1, gpus, rows)
    routed = route_schedule([op], topo, None, CFG)
    k = min(nics, rows)
    per_nic = nic_bytes(routed, topo)
    assert len(per_nic) == k
    assert max(per_nic.values()) <= math.ceil(rows / k) * KVB
    assert sum(per_nic.values()) == rows * KVB
    if k > 1:  # routed pieces land on the same rail; a direct message lands on the receiver's NIC
        assert nic_bytes(routed, topo, "in") == {n + nics: b for n, b in per_nic.items()}


def test_idle_nics_preferred_and_loads_balanced():
    topo = Topology(2, 4, 4)
    busy = direct(topo, 0, 4, 3, ring=1)  # 24 B below the threshold: stays direct on NIC 0 -> NIC 4
    big = direct(topo, 1, 5, 12, ring=0)
    routed = route_schedule([busy, big], topo, None, ZeppelinConfig(min_route_bytes=30))
    assert busy in routed
    per_nic = nic_bytes(routed, topo)
    assert per_nic[0] == 24  # NIC 0 got none of the big message's rows: 96 B water-filled over 1, 2, 3
    assert sorted(per_nic.items()) == [(0, 24), (1, 32), (2, 32), (3, 32)]


def test_threshold_small_messages_and_off():
    topo = Topology(2, 4)
    small = direct(topo, 3, 4, 10)
    assert route_schedule([small], topo, None, ZeppelinConfig(min_route_bytes=81)) == [small]
    assert route_schedule([small], topo, None, ZeppelinConfig(min_route_bytes=80)) != [small]
    # pieces never smaller than half the threshold: 80 B at threshold 80 -> 2 pieces of 40 B
    assert len([o for o in route_schedule([small], topo, None, ZeppelinConfig(min_route_bytes=80))
                if o.link == "nic"]) == 2
    assert route_schedule([small], topo, None, ZeppelinConfig(min_route_bytes=16, routing="off")) == [small]
    nvl = CommOp("intra", 0, 1, 0, 0, 1, 0, 1, 0, 10, 80, "nvlink", -1, "direct")
    assert nvl in route_schedule([nvl, small], topo, None, CFG)  # NVLink messages untouched


def test_threshold_follows_profile():
    ctx = toy_context(nodes=2)
    c = ctx.cost
    n = route_threshold_bytes(c)
    gain = 1 / c.bandwidth("nic") - 2 / c.bandwidth("nvlink")
    assert n == pytest.approx(4 * c.latency("nvlink") / gain, rel=1e-6)
    assert route_threshold_bytes(c, ZeppelinConfig(min_route_bytes=5)) == 5
    # break-even: 2 pieces (one dispatched, one combined) cost the same as direct at n bytes
    t_direct = c.transfer_s(n, "nic")
    t_routed = 2 * c.transfer_s(n / 2, "nvlink") + c.transfer_s(n / 2, "nic")
    assert t_routed == pytest.approx(t_direct, rel=1e-6)
    slow_nvlink = CostModel(c.model, ctx.profile.__class__(**{**ctx.profile.__dict__, "nvlink_GBps": 15.0}),
                            c.topology)
    assert route_threshold_bytes(slow_nvlink) == NEVER


def toy_inter_placement(lengths, ring_ranks, topo):
    docs = [DocPlan(i, L, "inter", 0, -1, zigzag_bounds(L, len(ring_ranks))) for i, L in enumerate(lengths)]
    return Placement(docs=docs, rings=[Ring(0, tuple(ring_ranks), "inter", tuple(range(len(lengths))))],
                     thresholds=Thresholds(1, 1, "test"), routing=True)


@pytest.mark.parametrize("ring", [(0, 1, 2, 3, 4, 5, 6, 7), (3, 4), (0, 5, 2, 7)])
def test_assembled_plan_with_routing_passes_checks_and_predicts_faster(ring):
    cfg = ZeppelinConfig(gpus_per_node=4, min_route_bytes=1)
    ctx = toy_context(nodes=2, gpus=4, nics=4, config=cfg)
    # Messages well above the toy profile's break-even (~150 KB): below it routing rightly loses.
    lengths = [16000, 4000]
    routed = assemble("test", lengths, ctx, toy_inter_placement(lengths, ring, ctx.topology))
    check_plan(routed)
    direct_plan = assemble("test", lengths, ctx, Placement(**{**toy_inter_placement(lengths, ring, ctx.topology)
                                                               .__dict__, "routing": False}))
    check_routed(direct_plan.schedule, routed.schedule, ctx.topology)
    assert any(o.stage == "transfer" for o in routed.schedule)
    # fewer exposed seconds predicted with the NIC traffic spread (the toy NIC is 10x slower than NVLink)
    assert routed.predicted_iteration_s <= direct_plan.predicted_iteration_s
    assert sum(c.comm_exposed_s for c in routed.cost) < sum(c.comm_exposed_s for c in direct_plan.cost)


def test_predicted_step_time_matches_stage_formula():
    """predict.py times a routed message as dispatch + transfer + combine, each on its busiest link."""
    ctx = toy_context(nodes=2, gpus=4, nics=4)
    c, topo = ctx.cost, ctx.topology
    op = direct(topo, 3, 4, 4000)
    routed = route_schedule([op], topo, c, CFG)
    t = step_message_times(routed, c)[(0, 0, 3, 4)]
    n = op.nbytes
    expect = (c.transfer_s(3 * n / 4, "nvlink") + c.transfer_s(n / 4, "nic") + c.transfer_s(3 * n / 4, "nvlink"))
    assert t == pytest.approx(expect, rel=1e-9)
    assert step_message_times([op], c)[(0, 0, 3, 4)] == pytest.approx(c.transfer_s(n, "nic"))


@pytest.mark.parametrize("cluster,nics", [("a800", 4), ("h200", 8)])
def test_explain_step_paper_clusters(cluster, nics):
    m, p = load_model("llama-7b"), load_profile(cluster)
    topo = Topology(2, p.gpus_per_node, p.nics_per_node, p.gpu_to_nic)
    e = explain_step(CostModel(m, p, topo), topo, 4096 * m.kv_bytes_per_token())
    assert e["pieces"] == nics and e["nics_used"] == nics
    assert e["routed_s"] < e["direct_s"]
    assert sum(x["bytes"] for x in e["piece_detail"]) == e["nbytes"]
    assert cluster in e["text"] and "routed" in e["text"]
    tiny = explain_step(CostModel(m, p, topo), topo, 1000)  # one token: goes direct
    assert tiny["pieces"] == 1 and tiny["routed_s"] == tiny["direct_s"]


def test_ring_ops_then_route_on_cluster_a_two_gpus_per_nic():
    """Cluster A wiring: proxies are GPUs of the chosen NIC; landing on the receiver when wired to it."""
    topo = Topology(2, 8, 4)
    docs = {0: DocPlan(0, 64, "inter", 0, -1, zigzag_bounds(64, 16))}
    ops = ring_ops([Ring(0, tuple(range(16)), "inter", (0,))], docs, topo, KVB)
    routed = route_schedule(ops, topo, None, CFG)
    check_routed(ops, routed, topo)
    step0 = [o for o in routed if o.step == 0 and o.stage == "transfer"]
    # 2 messages cross nodes per step (7 -> 8 and 15 -> 0), each over all 4 NICs of its node
    assert sorted(o.nic for o in step0) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert {o.dst for o in step0 if o.msg_dst == 8 and o.nic == 0} == {8}  # rank 8 is on NIC 0: no combine


def test_chunked_program_order_and_sizes():
    """Pieces cut into chunks (uneven): every stage of a piece tiles its rows with the same cuts, the
    bytes sum to the message's, no chunk exceeds the chunk size, and step_order runs each relayed
    chunk after the chunk that brought its rows, chunk i+1's dispatch no later than chunk i's transfer."""
    from megatron_zeppelin.planner.program import step_order
    ctx = toy_context(nodes=2, gpus=4, nics=4)
    c, topo = ctx.cost, ctx.topology
    op = direct(topo, 3, 4, 400_000)  # 3.2 MB: pieces of 100000 rows, in chunks of 33334, 33333, 33333
    chunk = 34_000 * KVB
    ops = route_schedule([op], topo, c, ZeppelinConfig(min_route_bytes=16, relay_chunk_bytes=chunk))
    assert sum(o.nbytes for o in ops if o.stage == "transfer") == op.nbytes
    assert all(o.nbytes <= chunk for o in ops)
    by_nic = defaultdict(list)
    for o in ops:
        if o.stage == "transfer":
            by_nic[o.nic].append((o.start, o.stop))
    assert min(map(len, by_nic.values())) >= 2 and len({b - a for v in by_nic.values() for a, b in v}) > 1
    for st in ("dispatch", "combine"):  # the same cuts as the transfers of the piece
        for o in ops:
            if o.stage == st:
                assert any((o.start, o.stop) in v for v in by_nic.values())
    items = [(o.stage, o.src, o.dst, (o.ring, o.block, o.msg_src, o.msg_dst), o.start, o.stop, o.src != o.msg_src)
             for o in ops]
    order, chunks = step_order(items)
    pos = {i: p for p, i in enumerate(order)}
    for i, o in enumerate(ops):
        if o.src != o.msg_src:  # relayed: after the hop that brought its rows
            src = [j for j, x in enumerate(ops) if x.dst == o.src and x.start == o.start and x.stage != o.stage]
            assert src and all(pos[j] < pos[i] for j in src)
    disp = sorted((o.start, pos[i]) for i, o in enumerate(ops) if o.stage == "dispatch" and o.dst == 0)
    tran = sorted((o.start, pos[i]) for i, o in enumerate(ops) if o.stage == "transfer" and o.src == 0)
    assert all(d[1] < t[1] for d, t in zip(disp[1:], tran[1:])) and disp[1][1] < tran[1][1]
    # predicted: pipelined below the stages' sum, above the slowest stage alone
    whole = route_schedule([op], topo, c, ZeppelinConfig(min_route_bytes=16, relay_chunk_bytes=0))
    t_whole = step_message_times(whole, c)[(0, 0, 3, 4)]
    t_pipe = step_message_times(ops, c)[(0, 0, 3, 4)]
    slowest = max(c.transfer_s(o.nbytes, o.link) for o in whole)
    assert slowest < t_pipe < t_whole
