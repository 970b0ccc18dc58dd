"""all_to_all_v on gloo: equals a single-process reference for many dtypes and shapes, both methods;
adjoint identity in float64; autograd backward is the mirror exchange; misuse raises clearly."""

import pytest
import torch
import torch.distributed as dist

from megatron_zeppelin.distributed.all_to_all import AllToAllError, all_to_all_v
from megatron_zeppelin.distributed.launch import run_distributed


def _count_matrix(world, seed):
    """counts[i][j]: rows rank i sends to rank j (zeros included), the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(0, 4, (world, world), generator=g)
    c[torch.rand(world, world, generator=g) < 0.3] = 0
    return c.tolist()


def _rows(src, dst, n, shape, dtype):
    """The rows src sends to dst: values that name (src, dst, row), so misplaced rows show."""
    base = torch.arange(n, dtype=torch.float64)[:, None] + 100 * src + 10_000 * dst
    numel = 1
    for s in shape:
        numel *= s
    v = base + torch.arange(numel, dtype=torch.float64)[None, :] / 8
    v = v.reshape((n,) + tuple(shape))
    if dtype == torch.bool:
        return (v.long() % 3) == 0
    if dtype.is_complex:
        return torch.complex(v, -v).to(dtype)
    return v.to(dtype)


def _exchange_cases(rank, world):
    out = []
    cases = [(torch.float64, (3,)), (torch.bfloat16, (1, 4)), (torch.int64, ()), (torch.bool, (5,)),
             (torch.float16, (2, 3)), (torch.complex64, (2,))]
    for k, (dtype, shape) in enumerate(cases):
        counts = _count_matrix(world, seed=k)
        send = counts[rank]
        recv = [counts[j][rank] for j in range(world)]
        x = torch.cat([_rows(rank, j, send[j], shape, dtype) for j in range(world)])
        want = torch.cat([_rows(j, rank, recv[j], shape, dtype) for j in range(world)])
        for method in ("p2p", "collective"):
            y = all_to_all_v(x, send, recv, method=method, check=(k == 0))
            out.append((str(dtype), method, torch.equal(y, want), tuple(y.shape) == tuple(want.shape)))

    # Adjoint in float64: <A x, w> summed over ranks == <x, A^T w>; autograd gives A^T w.
    counts = _count_matrix(world, seed=99)
    send, recv = counts[rank], [counts[j][rank] for j in range(world)]
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(sum(send), 7, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(sum(recv), 7, generator=g, dtype=torch.float64)
    ax = all_to_all_v(x, send, recv)
    atw = all_to_all_v(w, recv, send)
    dots = torch.stack([(ax * w).sum(), (x.detach() * atw).sum()])
    dist.all_reduce(dots)
    (ax * w).sum().backward()
    out.append(("adjoint", float(dots[0]), float(dots[1]), torch.equal(x.grad, atw)))

    # Misuse: wrong counts length, sum, self count; peers that disagree (every rank raises).
    errs = []
    own = [int(j == rank) for j in range(world)]
    for rows, send_c, recv_c in ((x.detach(), [1] * (world + 1), recv), (torch.zeros(5, 1), [0] * world, recv),
                                 (torch.zeros(1, 1), own, [0] * world)):
        try:
            all_to_all_v(rows, send_c, recv_c)
        except AllToAllError as e:
            errs.append(str(e))
    bad_recv = list(recv)
    bad_recv[(rank + 1) % world] += 1
    try:
        all_to_all_v(x.detach(), send, bad_recv, check=True)
    except AllToAllError as e:
        errs.append(str(e))
    out.append(("errors", errs))
    return out


@pytest.mark.parametrize("world", [3])
def test_all_to_all_v_reference_adjoint_and_guards(world):
    for rank_out in run_distributed(_exchange_cases, world, timeout=120):
        *cases, adj, errs = rank_out
        for dtype, method, equal, shape_ok in cases:
            assert equal and shape_ok, (dtype, method)
        _, lhs, rhs, grad_ok = adj
        assert lhs == pytest.approx(rhs, rel=1e-12) and grad_ok
        assert len(errs[1]) == 4, errs
        assert "one per group rank" in errs[1][0] and "x has 5 rows" in errs[1][1]
        assert "keeps 1 of its rows" in errs[1][2] and "callers' counts disagree" in errs[1][3]


def test_needs_initialised_group():
    with pytest.raises(AllToAllError, match="init_process_group"):
        all_to_all_v(torch.zeros(2, 1), [2], [2])
