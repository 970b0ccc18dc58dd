"""Routed schedules on gloo: every ring step's routed transfers deliver exactly the data of the direct
ones, the executed per-NIC bytes are the schedule's, and the attention engine's outputs and gradients
are bitwise equal with routing on and off (float64).

Each test runs under gloo's tag matching and under NCCL's (``semantics``: ZEPPELIN_P2P_SEMANTICS,
distributed/nccl_matching.py: a receive meets the oldest unmatched send of its peer pair whatever the
tag); the default run has the 2x2 exactness case under NCCL's rules, ``-m slow`` all the others."""

import zlib
from collections import defaultdict

import pytest
import torch
import torch.distributed as dist

from megatron_zeppelin.attention.engine import AttentionEngine
from megatron_zeppelin.attention.testing import hand_plan, rank_inputs
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.distributed.counters import CommCounters
from megatron_zeppelin.distributed.executor import StepExchange
from megatron_zeppelin.distributed.launch import run_distributed
from megatron_zeppelin.distributed.nccl_matching import ENV, P2PSemantics, semantics as p2p_semantics
from megatron_zeppelin.distributed.tags import ExchangeTags
from megatron_zeppelin.planner.build.assemble import assemble
from megatron_zeppelin.planner.build.checks import check_plan
from megatron_zeppelin.planner.context import Placement
from megatron_zeppelin.planner.build.routing import nic_bytes
from megatron_zeppelin.planner.testing import toy_context
from megatron_zeppelin.planner.types import CommOp
from megatron_zeppelin.spec.topology import Topology


CHUNK = 1000  # bytes: 7.8 rows of the toy model's 128-byte K/V, so pieces cut into several uneven chunks


def plans(topo: Topology, chunk=None):
    """(direct, routed) plans of one batch with inter rings over all ranks and over ranks of
    different nodes, an intra ring and local documents; every NIC message of >= 2 rows is routed,
    its pieces cut into chunks of <= ``chunk`` bytes (None: the toy profile's 2 MiB, no cut)."""
    g, w = topo.gpus_per_node, topo.world_size
    cross = (g - 1, g, w - 1) if topo.nodes > 2 else (g - 1, g)  # ring hops that all leave a node
    where = [tuple(range(w)), cross, (0, 1) if g > 1 else 0, 1 % w, w - 1, tuple(range(0, w, g))]
    lengths = [301, 97, 40, 5, 17, 64]
    direct = hand_plan(lengths, topo, where)
    cfg = ZeppelinConfig(gpus_per_node=g, min_route_bytes=1, relay_chunk_bytes=chunk)
    ctx = toy_context(topo.nodes, g, topo.nics_per_node, config=cfg)
    routed = assemble(direct.strategy, lengths, ctx, Placement(
        docs=list(direct.docs), rings=list(direct.rings), thresholds=direct.thresholds, routing=True))
    check_plan(direct)
    check_plan(routed)
    assert any(o.stage == "transfer" for o in routed.schedule)
    if chunk:  # pieces in several uneven chunks (one NIC carries several transfers of one message)
        per = defaultdict(list)
        for o in routed.schedule:
            if o.stage == "transfer":
                per[(o.queue, o.step, o.ring, o.block, o.msg_src, o.nic)].append(o.stop - o.start)
        assert max(map(len, per.values())) >= 2
        assert any(len(set(v)) > 1 for v in per.values())
        assert all(o.nbytes <= chunk for o in routed.schedule if o.stage != "direct")
    return direct, routed


def message_data(key, rows, width):
    """The block a message carries, the same on every rank (seeded by the message key)."""
    gen = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    return torch.randn(rows, width, generator=gen, dtype=torch.float64)


def run_steps(plan, rank, group, width, tags):
    """Run every (queue, step) of the schedule; returns received messages and per-step NIC bytes."""
    got, nic = {}, {}
    steps = sorted({(o.queue, o.step) for o in plan.schedule})
    for queue, step in steps:
        ops = plan.ops(queue, step)
        rows = defaultdict(int)
        for o in ops:
            rows[(o.ring, o.block, o.msg_src, o.msg_dst)] = max(rows[(o.ring, o.block, o.msg_src, o.msg_dst)], o.stop)
        pay = {(r, b, md): message_data((queue, step, r, b, ms, md), n, width)
               for (r, b, ms, md), n in rows.items() if ms == rank}
        c = CommCounters()
        out = StepExchange(ops, rank, group, pay, width, dtype=torch.float64, counters=c, tags=tags).start().wait()
        for (r, b, ms), t in out.items():
            got[(queue, step, r, b, ms)] = t
        nic[(queue, step)] = dict(c.bytes_by_nic)
    return got, nic


def engine_run(plan, rank, group, tags=None):
    (q, k, v, dout), idx = rank_inputs(plan, rank, 4, 2, 8, torch.float64, seed=7)
    lq, lk, lv = (x[idx].clone().requires_grad_(True) for x in (q, k, v))
    c = CommCounters()
    out = AttentionEngine(plan, rank, group, counters=c, tags=tags)(lq, lk, lv)
    out.backward(dout[idx])
    return [out.detach(), lq.grad, lk.grad, lv.grad], dict(c.bytes_by_nic)


def _body(rank, world, topo, chunk=None):
    direct, routed = plans(topo, chunk)
    width = direct.kv_bytes_per_token // 8  # float64 rows of exactly kv_bytes_per_token bytes
    group, tags = dist.group.WORLD, ExchangeTags()  # one tag sequence for every exchange on the group
    res = {}
    for name, plan in (("direct", direct), ("routed", routed)):
        got, nic = run_steps(plan, rank, group, width, tags)
        res[name] = ({k: t.numpy() for k, t in got.items()}, nic)
        tensors, nic_e = engine_run(plan, rank, group, tags)
        res[name + "_engine"] = ([t.numpy() for t in tensors], nic_e)
    tags.drain()
    return res  # numpy, not tensors: torch's queue would share tensor memory with a rank that exits


def check_topology(topo: Topology, results, chunk=None):
    direct, routed = plans(topo, chunk)
    width = direct.kv_bytes_per_token // 8
    for name, plan in (("direct", direct), ("routed", routed)):
        got = {}
        nic_exec = defaultdict(lambda: defaultdict(int))
        for rank, res in enumerate(results):
            g, nic = res[name]
            for k, t in g.items():
                assert k not in got
                got[k] = (rank, torch.from_numpy(t))
            for step, per in nic.items():
                for n, b in per.items():
                    nic_exec[step][n] += b
        # every message of every step arrives whole, at its msg_dst, with exactly the sender's data
        want = defaultdict(int)
        for o in plan.schedule:
            key = (o.queue, o.step, o.ring, o.block, o.msg_src)
            want[(key, o.msg_dst)] = max(want[(key, o.msg_dst)], o.stop)
        assert {k for k, _ in want} == set(got)
        for (key, md), rows in want.items():
            rank, t = got[key]
            assert rank == md
            q, s, r, b, ms = key
            assert torch.equal(t, message_data((q, s, r, b, ms, md), rows, width)), (name, key)
        # per-NIC bytes of every step: executed counters == the schedule
        for q, s in {(o.queue, o.step) for o in plan.schedule}:
            assert dict(nic_exec[(q, s)]) == nic_bytes(plan.ops(q, s), topo), (name, q, s)
    # routing spreads each step's inter-node bytes: the busiest NIC of a step carries less
    busiest = {name: sum(max(nic_bytes(p.ops(q, s), topo).values(), default=0)
                         for q, s in {(o.queue, o.step) for o in p.schedule})
               for name, p in (("direct", direct), ("routed", routed))}
    assert busiest["routed"] < busiest["direct"], busiest
    assert sum(o.nbytes for o in routed.schedule if o.link == "nic") == \
        sum(o.nbytes for o in direct.schedule if o.link == "nic")  # NIC bytes moved, not added
    # engine: outputs and gradients bitwise equal with routing on and off
    for rank, res in enumerate(results):
        a, _ = res["direct_engine"]
        b, nic_b = res["routed_engine"]
        for x, y, what in zip(a, b, ("out", "dq", "dk", "dv")):
            assert torch.equal(torch.from_numpy(x), torch.from_numpy(y)), (topo.describe(), rank, what)


TOPOLOGIES = [Topology(2, 2), Topology(2, 4, 2), Topology(4, 2)]
# (mode, marks): NCCL's rules in the default run, gloo's tags with -m slow; ``BOTH``: both slow
NCCL_FIRST = [pytest.param("nccl"), pytest.param("tags", marks=pytest.mark.slow)]
TAGS_FIRST = [pytest.param("tags"), pytest.param("nccl", marks=pytest.mark.slow)]
BOTH = ["tags", "nccl"]


def env(mode: str) -> dict:
    return {ENV: mode}


@pytest.mark.parametrize("semantics", NCCL_FIRST)
def test_routed_equals_direct_2x2(semantics):
    topo = TOPOLOGIES[0]
    check_topology(topo, run_distributed(_body, topo.world_size, topo, timeout=240, env=env(semantics)))


@pytest.mark.parametrize("semantics", NCCL_FIRST)
def test_chunked_relays_equal_direct_2x2(semantics):
    """Pipelined relays (pieces cut into uneven chunks of <= CHUNK bytes): the same data, bytes and
    engine results as direct, under NCCL's matching rules (default) and gloo's tags (slow)."""
    topo = TOPOLOGIES[0]
    check_topology(topo, run_distributed(_body, topo.world_size, topo, CHUNK, timeout=240, env=env(semantics)),
                   CHUNK)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [None, CHUNK], ids=["whole", "chunked"])
@pytest.mark.parametrize("semantics", BOTH)
@pytest.mark.parametrize("topo", [TOPOLOGIES[1], TOPOLOGIES[2], Topology(2, 4)],
                         ids=["2x4_2nics_cluster_a_wiring", "4x2", "2x4"])
def test_routed_equals_direct(topo, semantics, chunk):
    check_topology(topo, run_distributed(_body, topo.world_size, topo, chunk, timeout=300, env=env(semantics)),
                   chunk)


# --- relays progress without the proxies' compute (issue 4) -------------------------------------

def _one_routed_message(topo: Topology):
    """One message 0 -> first rank of the last node, routed: proxies are pure relays (neither end)."""
    from megatron_zeppelin.planner.build.routing import route_schedule
    ctx = toy_context(topo.nodes, topo.gpus_per_node, topo.nics_per_node,
                      config=ZeppelinConfig(gpus_per_node=topo.gpus_per_node, min_route_bytes=1))
    dst = (topo.nodes - 1) * topo.gpus_per_node
    rows = 64
    op = CommOp("inter", 0, 0, 0, 0, dst, 0, dst, 0, rows, rows * 16, "nic", topo.nic_of(0), "direct")
    ops = route_schedule([op], topo, ctx.cost, ctx.config)
    proxies = sorted({r for o in ops for r in (o.src, o.dst)} - {0, dst})
    return ops, dst, rows, proxies


def _proxy_blocked_body(rank, world, topo):
    """Each proxy 'computes' until the destination holds the message (a barrier the ends enter only
    after wait()): completes only if relays progress during the proxies' compute; a relay run inside
    wait() deadlocks here (the group's timeout turns that into an error, never a hang)."""
    ops, dst, rows, proxies = _one_routed_message(topo)
    side = dist.new_group(list(range(world)), timeout=__import__("datetime").timedelta(seconds=60))
    pay = {(0, 0): message_data("blocked", rows, 2)} if rank == 0 else {}
    tags = ExchangeTags()
    ex = StepExchange(ops, rank, dist.group.WORLD, pay, 2, dtype=torch.float64, tags=tags).start()
    got = None
    if rank in proxies:
        dist.barrier(group=side)  # the "compute" that only ends after the destination got its rows
        ex.wait()
    else:
        got = ex.wait().get((0, 0, 0))
        dist.barrier(group=side)
    tags.drain()
    return proxies, (got.numpy() if got is not None else None)


@pytest.mark.parametrize("semantics", TAGS_FIRST)
def test_proxies_relay_while_computing(semantics):
    topo = Topology(2, 2)
    ops, dst, rows, proxies = _one_routed_message(topo)
    assert proxies and any(o.stage == "transfer" for o in ops)
    res = run_distributed(_proxy_blocked_body, topo.world_size, topo, timeout=90, env=env(semantics))
    assert torch.equal(torch.from_numpy(res[dst][1]), message_data("blocked", rows, 2))


def _concurrent_body(rank, world, topo, rounds, chunk=None):
    """Every (queue, step) exchange of the routed plan in flight at once (distinct tags), waited in
    reverse order, and the same again from two threads at once (disjoint tag ranges); repeated.
    Under NCCL's rules not from two threads: two threads posting on one communicator have no
    posting order for NCCL to pair (the engine posts from one thread)."""
    import threading
    _, routed = plans(topo, chunk)
    width = routed.kv_bytes_per_token // 8
    steps = sorted({(o.queue, o.step) for o in routed.schedule})
    counters, tags = CommCounters(), ExchangeTags()  # shared by the threads: it is thread-safe

    def exchanges(tag0):
        out = []
        for i, (queue, step) in enumerate(steps):
            ops = routed.ops(queue, step)
            rows = defaultdict(int)
            for o in ops:
                rows[(o.ring, o.block, o.msg_src, o.msg_dst)] = max(rows[(o.ring, o.block, o.msg_src, o.msg_dst)], o.stop)
            pay = {(r, b, md): message_data((queue, step, r, b, ms, md), n, width)
                   for (r, b, ms, md), n in rows.items() if ms == rank}
            out.append(((queue, step), StepExchange(ops, rank, dist.group.WORLD, pay, width, dtype=torch.float64,
                                                    counters=counters, tag=tag0 + i, tags=tags).start()))
        return {(qs, r, b, ms): t for qs, ex in reversed(out) for (r, b, ms), t in ex.wait().items()}

    results, errors = [], []

    def worker(tag0):
        try:
            results.append(exchanges(tag0))
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    for _ in range(rounds):
        results.append(exchanges(0))
        if p2p_semantics() is P2PSemantics.NCCL:
            continue
        th = [threading.Thread(target=worker, args=(t,)) for t in (100, 200)]
        for t in th:
            t.start()
        for t in th:
            t.join(120)
        assert not errors, errors
    tags.drain()
    first = results[0]
    for r in results[1:]:
        assert r.keys() == first.keys() and all(torch.equal(r[k], first[k]) for k in first)
    return {k: t.numpy() for k, t in first.items()}, counters.as_dict()["bytes_by_link"], len(results)


def _check_concurrent(topo, res, rounds, threads=2, chunk=None):
    _, routed = plans(topo, chunk)
    width = routed.kv_bytes_per_token // 8
    want = defaultdict(int)
    for o in routed.schedule:
        want[((o.queue, o.step), o.ring, o.block, o.msg_src, o.msg_dst)] = max(
            want[((o.queue, o.step), o.ring, o.block, o.msg_src, o.msg_dst)], o.stop)
    got = {}
    for rank, (g, _, n) in enumerate(res):
        assert n == (1 + threads) * rounds
        for k, t in g.items():
            got[(k, rank)] = t
    assert len(got) == len(want)
    for (qs, r, b, ms, md), rows in want.items():
        t = torch.from_numpy(got[((qs, r, b, ms), md)])
        assert torch.equal(t, message_data((qs[0], qs[1], r, b, ms, md), rows, width))
    # counters from several threads add up exactly: 3 * rounds runs of the whole schedule
    sent = sum(sum(bl.values()) for _, bl, _ in res)
    per_row = routed.kv_bytes_per_token
    assert sent == (1 + threads) * rounds * sum((o.stop - o.start) * per_row for o in routed.schedule if o.src != o.dst)


@pytest.mark.parametrize("semantics", TAGS_FIRST)
def test_concurrent_routed_exchanges_world4(semantics):
    topo = Topology(2, 2)
    res = run_distributed(_concurrent_body, topo.world_size, topo, 3, timeout=180, env=env(semantics))
    _check_concurrent(topo, res, 3, threads=2 if semantics == "tags" else 0)


@pytest.mark.parametrize("semantics", NCCL_FIRST)
def test_concurrent_chunked_exchanges_world4(semantics):
    """Every exchange of the chunked routed plan in flight at once (a proxy's relays of one exchange
    still running when the next posts): each chunk meets its receive under NCCL's rules."""
    topo = Topology(2, 2)
    res = run_distributed(_concurrent_body, topo.world_size, topo, 2, CHUNK, timeout=180, env=env(semantics))
    _check_concurrent(topo, res, 2, threads=2 if semantics == "tags" else 0, chunk=CHUNK)


@pytest.mark.slow
@pytest.mark.parametrize("semantics", BOTH)
@pytest.mark.parametrize("topo", [Topology(2, 4), Topology(4, 2), Topology(2, 4, 2)], ids=["2x4", "4x2", "2x4_2nics"])
def test_concurrent_routed_exchanges_world8(topo, semantics):
    res = run_distributed(_concurrent_body, topo.world_size, topo, 5, timeout=300, env=env(semantics))
    _check_concurrent(topo, res, 5, threads=2 if semantics == "tags" else 0)
