"""Communication primitives on gloo: adjoint checks <A x, y> = <x, A^T y> in float64, misuse guards."""

import pytest
import torch
import torch.distributed as dist

from megatron_zeppelin.attention.testing import hand_plan, toy_route
from megatron_zeppelin.distributed.executor import StepExchange
from megatron_zeppelin.distributed.tags import ExchangeTags
from megatron_zeppelin.distributed.launch import run_distributed
from megatron_zeppelin.distributed.p2p import CommError, P2PExchange, ring_shift, send_recv
from megatron_zeppelin.spec.topology import Topology

F64 = torch.float64


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


def test_send_recv_and_ring_shift_adjoint_world3():
    for lhs, rhs, lhs2, rhs2 in run_distributed(_adjoint_send_recv, 3, timeout=300):
        assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs))
        assert abs(lhs2 - rhs2) <= 1e-12 * max(1.0, abs(lhs2))


def test_executor_adjoint_routed_world4():
    t = Topology(2, 2)
    plans = [toy_route(hand_plan([37, 3, 20, 9], t, [(0, 1, 2, 3), 1, (3, 0), 2])),
             toy_route(hand_plan([21, 8, 5], t, [(0, 2, 3), (1, 2), 0], comm="allgather"))]
    assert any(o.stage == "transfer" for o in plans[0].schedule)  # the routed path is exercised
    res = run_distributed(_adjoint_executor, 4, plans, timeout=300)
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
