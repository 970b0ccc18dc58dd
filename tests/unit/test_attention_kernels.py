"""Kernels, merge and the single-process engine against the float64 reference."""

import pytest
import torch

from megatron_zeppelin.attention.engine import AttentionEngine
from megatron_zeppelin.attention.kernels import KernelError, block_backward, block_forward
from megatron_zeppelin.attention.merge import merge
from megatron_zeppelin.attention.reference import reference_attention
from megatron_zeppelin.attention.testing import check_engine, hand_plan
from megatron_zeppelin.planner.types import PlanError
from megatron_zeppelin.spec.topology import Topology

F64 = torch.float64


def _dense(q, k, v, scale, off):
    """Autograd-able dense masked attention, the per-block oracle."""
    g = q.shape[1] // k.shape[1]
    ke, ve = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q, ke) * scale
    if off is not None:
        m = torch.arange(k.shape[0])[None, :] <= torch.arange(q.shape[0])[:, None] + off
        s = s.masked_fill(~m, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), ve), torch.logsumexp(s, -1).T


@pytest.mark.parametrize("backend", ["cpu_flash", "reference"])
@pytest.mark.parametrize("sq,sk,off", [(5, 5, 0), (4, 7, None), (3, 6, 2), (6, 3, None), (4, 6, 1), (3, 3, 7), (5, 2, 1)])
@pytest.mark.parametrize("kvh", [4, 1])
def test_block_forward_backward_match_dense(backend, sq, sk, off, kvh):
    g = torch.Generator().manual_seed(sq * 10 + sk)
    q = torch.randn(sq, 4, 8, dtype=F64, generator=g, requires_grad=True)
    k = torch.randn(sk, kvh, 8, dtype=F64, generator=g, requires_grad=True)
    v = torch.randn(sk, kvh, 8, dtype=F64, generator=g, requires_grad=True)
    o, l = block_forward(q, k, v, 0.3, off, backend)
    ro, rl = _dense(q, k, v, 0.3, off)
    assert torch.allclose(o, ro, atol=1e-12) and torch.allclose(l, rl, atol=1e-12)
    dout = torch.randn_like(ro)
    ro.backward(dout)
    dq, dk, dv = block_backward(dout, q.detach(), k.detach(), v.detach(), o, l, 0.3, off, backend)
    for a, b in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-11)


def test_empty_block_and_bad_backend():
    q = torch.zeros(0, 2, 4)
    o, l = block_forward(q, torch.zeros(3, 2, 4), torch.zeros(3, 2, 4), 1.0)
    assert o.shape == (0, 2, 4) and l.shape == (0, 2)
    with pytest.raises(KernelError, match="attention kernel"):
        block_forward(torch.zeros(2, 2, 4), torch.zeros(2, 2, 4), torch.zeros(2, 2, 4), 1.0, backend="nope")


def test_merge_of_two_key_halves_is_exact():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(6, 2, 4, dtype=F64, generator=g) for _ in range(3))
    full, lfull = block_forward(q, k, v, 0.5)
    a, la = block_forward(q, k[:2], v[:2], 0.5)
    b, lb = block_forward(q, k[2:], v[2:], 0.5)
    m, lm = merge(a, la, b, lb)
    assert torch.allclose(m, full, atol=1e-14) and torch.allclose(lm, lfull, atol=1e-14)


def test_reference_rejects_wrong_lengths():
    with pytest.raises(ValueError):
        reference_attention(torch.zeros(3, 1, 2), torch.zeros(3, 1, 2), torch.zeros(3, 1, 2), [2])


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_single_rank_engine_local_docs(dtype, tol):
    # world of one, no process group needed: every document local, varlen per-document kernels
    plan = hand_plan([7, 1, 30, 2], Topology(1, 1), [0, 0, 0, 0])
    r = check_engine(plan, 0, None, heads=4, kv_heads=1, dtype=dtype)
    assert max(r["out"], r["dq"], r["dk"], r["dv"]) <= tol


def test_engine_rejects_tensors_that_disagree_with_plan():
    plan = hand_plan([7, 3], Topology(1, 1), [0, 0])
    eng = AttentionEngine(plan, 0, None)
    with pytest.raises(PlanError, match="10 attention-layout tokens"):
        eng(torch.zeros(9, 2, 4), torch.zeros(9, 2, 4), torch.zeros(9, 2, 4))
    with pytest.raises(PlanError, match="multiple of kv_heads"):
        eng(torch.zeros(10, 3, 4), torch.zeros(10, 2, 4), torch.zeros(10, 2, 4))
    with pytest.raises(PlanError, match="outside the plan"):
        AttentionEngine(plan, 1, None)


def test_merge_rows_index_paths_agree():
    # unique=True (the caller knows no row repeats: no torch.unique) equals the general index path
    from megatron_zeppelin.attention.merge import merge_rows
    g = torch.Generator().manual_seed(2)
    o0, l0 = torch.randn(6, 2, 3, dtype=F64, generator=g), torch.randn(6, 2, dtype=F64, generator=g)
    l0[1] = float("-inf")
    o, l = torch.randn(3, 2, 3, dtype=F64, generator=g), torch.randn(3, 2, dtype=F64, generator=g)
    rows = torch.tensor([4, 1, 2])
    a = (o0.clone(), l0.clone())
    b = (o0.clone(), l0.clone())
    merge_rows(*a, rows, o, l)
    merge_rows(*b, rows, o, l, unique=True)
    assert torch.allclose(a[0], b[0], atol=1e-15) and torch.allclose(a[1], b[1], atol=1e-15)
    assert torch.equal(a[0][[0, 3, 5]], o0[[0, 3, 5]]) and torch.equal(b[0][1], o[1])  # row 1 saw nothing before
