"""Communication primitives on gloo: adjoint checks <A x, y> = <x, A^T y> in float64, misuse guards,
and NCCL's matching rules (ZEPPELIN_P2P_SEMANTICS=nccl, distributed/nccl_matching.py): pairing by
posting order, mismatches named, and the executor's relays posted in the program's order."""

import pytest
import torch
import torch.distributed as dist

from megatron_zeppelin.attention.testing import hand_plan, toy_route
from megatron_zeppelin.distributed.executor import StepExchange
from megatron_zeppelin.distributed.tags import ExchangeTags
from megatron_zeppelin.distributed.launch import run_distributed
from megatron_zeppelin.distributed.p2p import CommError, P2PExchange, ring_shift, send_recv
from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.planner.types import CommOp
from megatron_zeppelin.spec.topology import Topology

F64 = torch.float64
NCCL = {"ZEPPELIN_P2P_SEMANTICS": "nccl"}
TAGS_FIRST = [pytest.param("tags"), pytest.param("nccl", marks=pytest.mark.slow)]  # NCCL's rules: -m slow


def _allsum(x: float) -> float:
    t = torch.tensor([x], dtype=F64)
    dist.all_reduce(t)
    return t.item()


def _adjoint_send_recv(rank, world):
    g = torch.Generator().manual_seed(100 + rank)
    # irregular pattern: rank r sends (r+1) rows to every rank j != r, two messages to (r+1)
    peers = [j for j in range(world) if j != rank] + [(rank + 1) % world]
    xs = [torch.randn(rank + 1, 3, dtype=F64, generator=g, requires_grad=True) for _ in peers]
    rpeers = [j for j in range(world) if j != rank] + [(rank - 1) % world]
    shapes = [(j + 1, 3) for j in rpeers]
    ys = send_recv(list(zip(peers, xs)), list(zip(rpeers, shapes)), dist.group.WORLD)
    w = [torch.randn(s, dtype=F64, generator=g) for s in shapes]
    lhs = _allsum(sum((y * wi).sum().item() for y, wi in zip(ys, w)))
    sum((y * wi).sum() for y, wi in zip(ys, w)).backward()  # A^T w lands in x.grad
    rhs = _allsum(sum((x.detach() * x.grad).sum().item() for x in xs))
    # ring shift
    ranks = tuple(reversed(range(world)))
    x = torch.randn(4, 2, dtype=F64, generator=g, requires_grad=True)
    y = ring_shift(x, ranks, rank, dist.group.WORLD)
    wy = torch.randn(4, 2, dtype=F64, generator=g)
    lhs2 = _allsum((y * wy).sum().item())
    (y * wy).sum().backward()
    rhs2 = _allsum((x.detach() * x.grad).sum().item())
    return lhs, rhs, lhs2, rhs2


def _adjoint_executor(rank, world, plans):
    """Executor (all stages, routed) forward vs its reverse: the reverse is the transpose."""
    out, tags = [], ExchangeTags()
    for plan in plans:
        for (queue, step) in sorted({(o.queue, o.step) for o in plan.schedule}):
            ops = [o for o in plan.schedule if o.queue == queue and o.step == step]
            g = torch.Generator().manual_seed(rank * 1000 + step)
            rows = {}
            for o in ops:
                k = (o.ring, o.block)
                rows[k] = max(rows.get(k, 0), o.stop)
            mine = {(o.ring, o.block) for o in ops if o.msg_src == rank}
            x = {k: torch.randn(rows[k], 5, dtype=F64, generator=g) for k in sorted(mine)}
            got = StepExchange(ops, rank, dist.group.WORLD, x, 5, dtype=F64, tags=tags).start().wait()
            y = {k: torch.randn(t.shape, dtype=F64, generator=g) for k, t in sorted(got.items())}
            lhs = _allsum(sum((got[k] * y[k]).sum().item() for k in got))
            back = StepExchange(ops, rank, dist.group.WORLD, {(k[0], k[1], k[2]): t for k, t in y.items()}, 5,
                                dtype=F64, reverse=True, tags=tags).start().wait()
            rhs = _allsum(sum((x[(r, b)] * t).sum().item() for (r, b, _), t in back.items()))
            out.append((queue, step, lhs, rhs, len(ops)))
    tags.drain()
    return out


@pytest.mark.parametrize("semantics", TAGS_FIRST)
def test_send_recv_and_ring_shift_adjoint_world3(semantics):
    for lhs, rhs, lhs2, rhs2 in run_distributed(_adjoint_send_recv, 3, timeout=300,
                                                env={"ZEPPELIN_P2P_SEMANTICS": semantics}):
        assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs))
        assert abs(lhs2 - rhs2) <= 1e-12 * max(1.0, abs(lhs2))


@pytest.mark.parametrize("semantics", TAGS_FIRST)
def test_executor_adjoint_routed_world4(semantics):
    t = Topology(2, 2)
    plans = [toy_route(hand_plan([37, 3, 20, 9], t, [(0, 1, 2, 3), 1, (3, 0), 2])),
             toy_route(hand_plan([21, 8, 5], t, [(0, 2, 3), (1, 2), 0], comm="allgather"))]
    assert any(o.stage == "transfer" for o in plans[0].schedule)  # the routed path is exercised
    res = run_distributed(_adjoint_executor, 4, plans, timeout=300, env={"ZEPPELIN_P2P_SEMANTICS": semantics})
    for items in zip(*res):
        q, s, lhs, rhs, n = items[0]
        assert n > 0 and abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs)), (q, s, lhs, rhs)


def test_guards_against_misuse():
    ex = P2PExchange([], [])
    with pytest.raises(CommError, match="before start"):
        ex.wait()
    ex.start()
    with pytest.raises(CommError, match="twice"):
        ex.start()
    ex.wait()
    with pytest.raises(CommError, match="twice"):
        ex.wait()
    st = StepExchange([], 0, None, {}, 4, tags=ExchangeTags())
    with pytest.raises(CommError, match="before start"):
        st.wait()
    st.start()
    with pytest.raises(CommError, match="twice"):
        st.start()
    with pytest.raises(CommError, match="not a member"):
        ring_shift(torch.zeros(1), (1, 2), 0)


# --- NCCL's matching rules (distributed/nccl_matching.py, ZEPPELIN_P2P_SEMANTICS=nccl) -------------


def _pair_cases(rank, world):
    """Rank 0 sends two messages to rank 1, which posts its receives in the same order, then in the
    other order. Returns per case what rank 1 got (the buffers' values or the error)."""
    out, keep = {}, []  # exchanges live until the end: a gloo request freed early is cancelled
    a, b = torch.arange(6, dtype=F64).view(3, 2), 10 + torch.arange(6, dtype=F64).view(3, 2)

    def case(name, sends, recvs):
        if rank == 0:
            P2PExchange([(1, t, tag) for t, tag in sends], [], dist.group.WORLD).start().wait()
            return
        bufs = [torch.zeros(shape, dtype=dt) for shape, dt, _ in recvs]
        ex = P2PExchange([], [(0, buf, tag) for buf, (_, _, tag) in zip(bufs, recvs)], dist.group.WORLD).start()
        keep.append(ex)
        try:
            ex.wait()
            out[name] = [buf.tolist() for buf in bufs]
        except ZeppelinError as e:
            out[name] = f"{type(e).__name__}: {e}"

    case("same_order", [(a, 5), (b, 9)], [((3, 2), F64, 5), ((3, 2), F64, 9)])
    # gloo pairs by tag (each buffer gets its own message); NCCL by order (the first receive meets
    # the first send, whose tag is another): raises in NCCL mode
    case("swapped", [(a, 5), (b, 9)], [((3, 2), F64, 9), ((3, 2), F64, 5)])
    dist.barrier()
    return out


def test_nccl_semantics_pairs_by_posting_order_world2():
    tags = run_distributed(_pair_cases, 2, timeout=120)[1]
    nccl = run_distributed(_pair_cases, 2, timeout=120, env=NCCL)[1]
    a, b = [float(x) for x in range(6)], [float(x) for x in range(10, 16)]
    want = [[v[i:i + 2] for i in range(0, 6, 2)] for v in (a, b)]
    assert tags["same_order"] == want and nccl["same_order"] == want
    assert tags["swapped"] == want[::-1]  # gloo: by tag
    # NCCL: the receive of tag 9 (posted first) meets the send of tag 5 (posted first): both named
    err = nccl["swapped"]
    assert err.startswith("MatchError") and "differs in tag" in err, err
    assert "rank 1: irecv #2 from rank 0 (tag 9, shape (3, 2), torch.float64)" in err, err  # after #0, #1
    assert "rank 0: isend #2 to rank 1 (tag 5, shape (3, 2), torch.float64)" in err, err


MISMATCH = {"dtype": ((3, 2), torch.int64, 4), "size": ((2, 2), F64, 4), "tag": ((3, 2), F64, 8)}


def _mismatch_cases(rank, world):
    """Per kind, one send of rank 0 -> 1 (tag 4, (3, 2) float64) and a receive that differs in that
    kind; rank 1 returns each error."""
    t = torch.arange(6, dtype=F64).view(3, 2)
    keep, out = [], {}  # rank 0's sends are not waited (a payload of another size never matches)
    for kind, (shape, dtype, tag) in MISMATCH.items():
        if rank == 0:
            keep.append(P2PExchange([(1, t, 4)], [], dist.group.WORLD).start())
            continue
        ex = P2PExchange([], [(0, torch.zeros(shape, dtype=dtype), tag)], dist.group.WORLD).start()
        keep.append(ex)
        try:
            ex.wait()
            out[kind] = "no error"
        except ZeppelinError as e:
            out[kind] = f"{type(e).__name__}: {e}"
    dist.barrier()  # rank 0 keeps its requests until rank 1 has checked
    return out


def test_nccl_semantics_mismatch_names_both_ops():
    errs = run_distributed(_mismatch_cases, 2, timeout=60, env=NCCL)[1]
    for i, (kind, (shape, dtype, tag)) in enumerate(MISMATCH.items()):
        err = errs[kind]
        assert err.startswith("MatchError") and f"differs in {'shape' if kind == 'size' else kind}" in err, err
        assert f"rank 0: isend #{i} to rank 1 (tag 4, shape (3, 2), torch.float64)" in err, err
        assert f"rank 1: irecv #{i} from rank 0 (tag {tag}, shape {shape}, {dtype})" in err, err


def _relay_order_ops():
    """Ranks 0 (source), 1 (proxy), 2 (destination). Exchange 1: a message 0 -> 2 routed through 1
    (dispatch 0 -> 1, transfer 1 -> 2). Exchange 2: a direct message 1 -> 2 of the same size."""
    routed = [CommOp("inter", 0, 0, 0, 0, 2, 0, 1, 0, 4, 32, "nvlink", -1, "dispatch"),
              CommOp("inter", 0, 0, 0, 0, 2, 1, 2, 0, 4, 32, "nic", 0, "transfer")]
    direct = [CommOp("inter", 1, 0, 1, 1, 2, 1, 2, 0, 4, 32, "nic", 0, "direct")]
    return routed, direct


def _relay_order_body(rank, world):
    """The proxy posts exchange 2 while its relay of exchange 1 still waits for its piece (the source
    posts exchange 1 only after the proxy has posted both: a side barrier forces that timing). The
    destination posts its receives in program order: exchange 1's relayed piece from the proxy, then
    exchange 2's message from the proxy. Under NCCL's matching the proxy must post its sends to the
    destination in that order, whatever its relay thread's timing."""
    import datetime
    routed, direct = _relay_order_ops()
    side = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=60))
    data = {m: torch.full((4, 2), float(m), dtype=F64) for m in (1, 2)}
    tags = ExchangeTags()
    if rank == 0:
        dist.barrier(group=side)  # after the proxy posted exchange 2
    ex1 = StepExchange(routed, rank, dist.group.WORLD, {(0, 0): data[1]} if rank == 0 else {}, 2, dtype=F64,
                       tags=tags).start()
    ex2 = StepExchange(direct, rank, dist.group.WORLD, {(0, 1): data[2]} if rank == 1 else {}, 2, dtype=F64,
                       tags=tags).start()
    if rank != 0:
        dist.barrier(group=side)
    got = {}
    for name, ex in (("routed", ex1), ("direct", ex2)):
        got.update({name: t.tolist() for t in ex.wait().values()})
    tags.drain()
    return got


@pytest.mark.parametrize("semantics", ["tags", "nccl"])
def test_relay_posts_in_program_order(semantics):
    got = run_distributed(_relay_order_body, 3, timeout=90, env={"ZEPPELIN_P2P_SEMANTICS": semantics})[2]
    assert got == {"routed": [[1.0, 1.0]] * 4, "direct": [[2.0, 2.0]] * 4}, got
