"""The varlen kernel layer on CPU: piece decomposition, the CPU backends, and every GPU adapter's
argument construction against signature-faithful fakes (kernel_fakes.py) and torch's real schemas."""

import functools

import pytest
import torch

import kernel_fakes as kf
from megatron_zeppelin.attention.kernels import Kernel, KernelError, Varlen, plan_calls, resolve, select, split_pair
from megatron_zeppelin.attention.kernels import flash_attn as fa_adapter
from megatron_zeppelin.attention.kernels import te as te_adapter
from megatron_zeppelin.attention.kernels import torch_flash
from megatron_zeppelin.attention.testing import check_engine, hand_plan
from megatron_zeppelin.spec.topology import Topology

F64 = torch.float64


def _dense_mask(sq, sk, off):
    if off is None:
        return torch.ones(sq, sk, dtype=torch.bool)
    return torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + off


@pytest.mark.parametrize("sq,sk", [(1, 1), (5, 5), (3, 7), (7, 3), (4, 9)])
@pytest.mark.parametrize("off", [None, -3, -1, 0, 1, 2, 5, 12])
def test_pieces_cover_the_offset_mask_exactly(sq, sk, off):
    got = torch.zeros(sq, sk, dtype=torch.bool)
    for causal, (qa, qb), (ka, kb) in split_pair(slice(0, sq), slice(0, sk), off):
        m = _dense_mask(qb - qa, kb - ka, (kb - ka) - (qb - qa) if causal else None)
        assert not got[qa:qb, ka:kb][m].any()  # no key counted twice
        got[qa:qb, ka:kb] |= m
    assert torch.equal(got, _dense_mask(sq, sk, off))


def _pairs():
    """A step as the engine makes it: two documents, a diagonal, full blocks, an all-gathered prefix
    (offset), a row seen by two pairs (merged by LSE), and an odd-length local document."""
    return [(slice(0, 4), slice(0, 4), 0), (slice(4, 7), slice(0, 4), None), (slice(4, 7), slice(4, 7), 0),
            (slice(7, 12), slice(7, 14), 3), (slice(12, 13), slice(14, 15), 0), (slice(13, 13), slice(0, 2), None)]


def _inputs(dtype, heads=4, kvh=2, d=16, t=15, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(t, h, d, generator=g, dtype=F64).to(dtype) for h in (heads, kvh, kvh, heads)]


def _dense_reference(q, k, v, dout, pairs, scale):
    """Autograd float64 oracle of the pairs: per query row, softmax over all its visible keys."""
    q, k, v = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    s = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(g, 1)) * scale
    vis = torch.zeros(q.shape[0], k.shape[0], dtype=torch.bool)
    for qr, kr, off in pairs:
        vis[qr, kr] |= _dense_mask(qr.stop - qr.start, kr.stop - kr.start, off)
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.where(vis, torch.exp(s - lse[..., None]), torch.zeros_like(s))
    out = torch.einsum("hqk,khd->qhd", p, v.repeat_interleave(g, 1))
    out.backward(dout.double())
    return out.detach(), lse.T.detach(), q.grad, k.grad, v.grad, vis.any(1)


def _run(backend, q, k, v, dout, pairs, scale):
    acc = F64 if q.dtype == F64 else torch.float32
    out = torch.zeros(q.shape, dtype=acc)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=acc)
    from megatron_zeppelin.attention.kernels.pieces import pairs_backward, pairs_forward
    pairs_forward(lambda *a: select.forward(backend, *a), q, k, v, pairs, out, lse, scale)
    o = out.to(q.dtype)
    grads = [torch.zeros(x.shape, dtype=acc) for x in (q, k, v)]
    pairs_backward(lambda *a: select.backward(backend, *a), dout, q, k, v, o, lse, pairs, *grads, scale)
    return out, lse, grads


def _rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def _check(backend, dtype, tol):
    q, k, v, dout = _inputs(dtype)
    out, lse, grads = _run(backend, q, k, v, dout, _pairs(), 0.3)
    ro, rl, *rg, seen = _dense_reference(q, k, v, dout, _pairs(), 0.3)
    assert _rel(out, ro) < tol and (lse[seen] - rl[seen]).abs().max() < tol * 10
    assert torch.isneginf(lse[~seen]).all() and (out[~seen] == 0).all()  # rows that see nothing
    for a, b in zip(grads, rg):
        assert _rel(a, b) < tol


@pytest.mark.parametrize("backend", ["cpu_flash", "reference"])
@pytest.mark.parametrize("dtype,tol", [(F64, 1e-12), (torch.float32, 1e-5)])
def test_cpu_backends_on_a_step_of_pairs(backend, dtype, tol):
    _check(backend, dtype, tol)


@pytest.fixture
def fakes(monkeypatch):
    aten, fa = kf.FakeAten(), kf.FakeFlashAttn()
    monkeypatch.setattr(torch_flash, "forward", functools.partial(torch_flash.forward, ops=aten))
    monkeypatch.setattr(torch_flash, "backward", functools.partial(torch_flash.backward, ops=aten))
    monkeypatch.setattr(fa_adapter, "forward", functools.partial(fa_adapter.forward, fa=fa))
    monkeypatch.setattr(fa_adapter, "backward", functools.partial(fa_adapter.backward, fa=fa))
    return aten


@pytest.mark.parametrize("backend", ["torch_flash", "flash_attn"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_adapters_against_signature_faithful_fakes(fakes, backend, dtype):
    _check(backend, dtype, 2e-2)


@pytest.mark.parametrize("packed", [True, False])
def test_te_adapter_both_stats_layouts(monkeypatch, packed):
    te = kf.FakeTE(packed)
    monkeypatch.setattr(te_adapter, "forward", functools.partial(te_adapter.forward, te=te))
    monkeypatch.setattr(te_adapter, "backward", functools.partial(te_adapter.backward, te=te))
    _check("te", torch.bfloat16, 2e-2)


def test_torch_flash_arguments_bind_to_the_real_schemas():
    q, k, v, dout = _inputs(torch.bfloat16)
    spec = Varlen((4, 11), (4, 13), causal=True)
    kv = torch.zeros(17, 2, 16, dtype=torch.bfloat16)
    args, kw = torch_flash.forward_args(q, kv, kv, spec, 0.3)
    b = kf.bind_schema(torch.ops.aten._flash_attention_forward.default._schema, args, kw)
    assert b["cum_seq_q"].dtype == torch.int32 and b["cum_seq_q"].tolist() == [0, 4, 15]
    assert b["max_q"] == 11 and b["max_k"] == 13 and b["is_causal"] is True and b["scale"] == 0.3
    lse = torch.zeros(15, 4)
    args, kw = torch_flash.backward_args(dout, q, args[1], args[2], q, lse, spec, 0.3)
    b = kf.bind_schema(torch.ops.aten._flash_attention_backward.default._schema, args, kw)
    assert b["cum_seq_k"].tolist() == [0, 4, 17] and tuple(b["logsumexp"].shape) == (4, 15)


def test_the_fakes_reject_what_the_kernels_reject():
    q, k, v, dout = _inputs(torch.bfloat16)
    aten = kf.FakeAten()
    z = torch.zeros((), dtype=torch.int64)  # the old CUDA backward's cum_seq_q / cum_seq_k
    lse = torch.zeros(4, 15)
    with pytest.raises(kf.FakeKernelError, match="int32"):
        aten._flash_attention_backward(dout, q, k, v, q, lse, z, z, 15, 15, 0.0, True, z, z, scale=0.3)
    cu = torch.tensor([0, 15], dtype=torch.int32)
    with pytest.raises(kf.FakeKernelError, match="logsumexp"):  # [total_q, heads] is the wrong layout
        aten._flash_attention_backward(dout, q, k, v, q, lse.T, cu, cu, 15, 15, 0.0, True, z, z, scale=0.3)
    with pytest.raises(kf.FakeKernelError, match="does not conform"):  # a float max_q
        aten._flash_attention_forward(q, k, v, cu, cu, 15.0, 15, 0.0, True, False, scale=0.3)
    with pytest.raises(kf.FakeKernelError, match="fp16/bf16"):
        aten._flash_attention_forward(q.float(), k.float(), v.float(), cu, cu, 15, 15, 0.0, True, False)
    te = kf.FakeTE(True)
    with pytest.raises(kf.FakeKernelError, match="window_size"):
        te.fused_attn_fwd(True, 15, 15, cu, cu, q, k, v, q.dtype, kf.FusedAttnBackend.F16_arbitrary_seqlen,
                          attn_scale=0.3, qkv_layout="thd_thd_thd", o_format="thd",
                          attn_mask_type="padding_causal_bottom_right")


def test_te_stats_layouts_round_trip():
    spec = Varlen((3, 1, 4), (3, 2, 5), causal=True)
    lse = torch.randn(8, 2)
    for packed in (True, False):
        st = te_adapter.lse_to_stats(lse, spec, packed)
        assert st.shape == ((8, 2, 1) if packed else (3, 2, 4, 1))
        assert torch.equal(te_adapter.stats_to_lse(st, spec), lse)


def test_resolution_and_errors_name_the_flag():
    cpu = torch.device("cpu")
    assert resolve("auto", cpu, torch.float64) == "cpu_flash" and resolve("auto", cpu, torch.bfloat16) == "reference"
    assert resolve("auto", torch.device("cuda"), torch.float32) == "reference"
    for name in ("torch_flash", "te", "flash_attn"):
        with pytest.raises(KernelError, match="--zeppelin-attention-kernel"):
            resolve(name, cpu, torch.float32)
    with pytest.raises(KernelError, match="--zeppelin-attention-kernel"):
        Kernel("flash3")
    with pytest.raises(KernelError, match="keys >= queries"):
        Varlen((3,), (2,), causal=True)


def test_one_kernel_call_for_all_local_documents(monkeypatch):
    calls = []
    real = select.forward
    monkeypatch.setattr(select, "forward", lambda *a: calls.append(a[4]) or real(*a))
    plan = hand_plan([7, 1, 30, 2, 5], Topology(1, 1), [0, 0, 0, 0, 0])
    r = check_engine(plan, 0, None, heads=4, kv_heads=2, dtype=F64)
    assert max(r["out"], r["dq"], r["dk"], r["dv"]) <= 1e-10
    assert len(calls) == 1 and calls[0].seqlens_q == calls[0].seqlens_k and sum(calls[0].seqlens_q) == 45


def test_a_step_is_one_call_unless_some_rows_see_only_full_keys():
    # _pairs: the diagonal + full block of rows 4:7 merge into one causal sequence (full keys first),
    # the offset pair's one fully-seeing row joins the causal call: one call
    calls = plan_calls([_pairs()])
    assert [c.spec.causal for c in calls] == [True]
    assert calls[0].spec.seqlens_q == (4, 3, 4, 1, 1) and calls[0].spec.seqlens_k == (4, 7, 7, 7, 1)
    assert calls[0].q_rows == slice(0, 13)  # row order kept: the queries are sliced, not gathered
    # rows 4:7 see only a full block while rows 0:4 see a causal run: a causal and a full call
    calls = plan_calls([[(slice(0, 4), slice(0, 4), 0), (slice(4, 7), slice(0, 4), None)]])
    assert [(c.spec.causal, c.spec.seqlens_q) for c in calls] == [(True, (4,)), (False, (3,))]
    # a later zigzag step of two rings (two K/V tensors), all full: one call; rows 0:2 see keys of both
    calls = plan_calls([[(slice(0, 2), slice(0, 3), None), (slice(2, 4), slice(3, 5), None)],
                        [(slice(0, 2), slice(0, 2), None)]])
    assert len(calls) == 1 and calls[0].spec.seqlens_q == (2, 2) and calls[0].spec.seqlens_k == (5, 2)
    (s0, r0, d0), (s1, r1, d1) = calls[0].k_parts  # packed K: ring 0's 3 rows, ring 1's 2, ring 0's 2
    assert (s0, r0, d0.tolist(), s1, r1, d1) == (0, slice(0, 5), [0, 1, 2, 5, 6], 1, slice(0, 2), slice(3, 5))


def test_one_sequence_with_keys_of_two_kv_tensors_is_exact():
    # a zigzag member's own block split over two K/V tensors: rows 4:7 see tensor A fully and B causally
    from megatron_zeppelin.attention.kernels import attend_blocks, attend_blocks_backward
    q, k, v, dout = _inputs(F64, t=7)
    whole = [(slice(0, 4), slice(0, 4), 0), (slice(4, 7), slice(0, 4), None), (slice(4, 7), slice(4, 7), 0)]
    a = [(slice(0, 4), slice(0, 4), 0), (slice(4, 7), slice(0, 4), None)]
    b = [(slice(4, 7), slice(0, 3), 0)]
    assert len(plan_calls([a, b])) == 1
    out1, lse1, g1 = _run("cpu_flash", q, k, v, dout, whole, 0.3)
    ro, rl, *rg, _ = _dense_reference(q, k, v, dout, whole, 0.3)
    out2 = torch.zeros(q.shape, dtype=F64)
    lse2 = torch.full(q.shape[:2], float("-inf"), dtype=F64)
    attend_blocks(q, [(k[:4], v[:4], a), (k[4:], v[4:], b)], out2, lse2, 0.3, "cpu_flash")
    dq, dk, dv = (torch.zeros(x.shape, dtype=F64) for x in (q, k, v))
    attend_blocks_backward(dout, q, out2, lse2, dq, [(k[:4], v[:4], dk[:4], dv[:4], a),
                                                      (k[4:], v[4:], dk[4:], dv[4:], b)], 0.3, "cpu_flash")
    assert _rel(out2, ro) < 1e-12 and _rel(lse2, rl) < 1e-12 and _rel(out1, ro) < 1e-12
    for x, y in zip((dq, dk, dv), rg):
        assert _rel(x, y) < 1e-12


@pytest.mark.parametrize("backend", ["torch_flash", "flash_attn", "te"])
def test_the_gpu_checks_zigzag_case_runs_each_adapter_on_cpu(fakes, monkeypatch, backend):
    # the same code path as tests/gpu/test_gpu_kernels.py, through the fakes
    te = kf.FakeTE(packed=False)
    monkeypatch.setattr(te_adapter, "forward", functools.partial(te_adapter.forward, te=te))
    monkeypatch.setattr(te_adapter, "backward", functools.partial(te_adapter.backward, te=te))
    import megatron_zeppelin.attention.kernels as kernels
    from megatron_zeppelin.attention.kernels.checks import zigzag_case
    monkeypatch.setattr(kernels, "resolve", lambda name, *a: name)  # the fakes run on CPU
    calls = []
    real_f, real_b = select.forward, select.backward
    monkeypatch.setattr(select, "forward", lambda *a: calls.append("f") or real_f(*a))
    monkeypatch.setattr(select, "backward", lambda *a: calls.append("b") or real_b(*a))
    errs = zigzag_case(backend, [37, 5, 1], members=3, heads=4, kv_heads=2, dtype=torch.bfloat16)
    assert max(errs.values()) < 3e-2, errs
    assert calls == ["f"] * 3 + ["b"] * 3  # one call per ring step for every member and document


def test_blocks_over_several_kv_tensors_equal_one_tensor():
    # a queue step with two rings: each ring's K/V message is its own tensor, still <= 2 calls
    from megatron_zeppelin.attention.kernels import attend_blocks, attend_blocks_backward
    q, k, v, dout = _inputs(F64)
    cut = 7
    pairs_a = [p for p in _pairs() if p[1].stop <= cut]
    pairs_b = [(qr, slice(kr.start - cut, kr.stop - cut), off) for qr, kr, off in _pairs() if kr.start >= cut]
    assert len(pairs_a) + len(pairs_b) == len(_pairs())
    out1, lse1, g1 = _run("cpu_flash", q, k, v, dout, _pairs(), 0.3)
    out2 = torch.zeros(q.shape, dtype=F64)
    lse2 = torch.full(q.shape[:2], float("-inf"), dtype=F64)
    attend_blocks(q, [(k[:cut], v[:cut], pairs_a), (k[cut:], v[cut:], pairs_b)], out2, lse2, 0.3, "cpu_flash")
    dq, dk, dv = (torch.zeros(x.shape, dtype=F64) for x in (q, k, v))
    attend_blocks_backward(dout, q, out2, lse2, dq, [(k[:cut], v[:cut], dk[:cut], dv[:cut], pairs_a),
                                                      (k[cut:], v[cut:], dk[cut:], dv[cut:], pairs_b)], 0.3, "cpu_flash")
    assert torch.allclose(out1, out2, atol=1e-13) and torch.equal(torch.isneginf(lse1), torch.isneginf(lse2))
    for a, b in zip(g1, (dq, dk, dv)):
        assert torch.allclose(a, b, atol=1e-12)


def test_the_flag_reaches_the_engine(monkeypatch):
    import argparse

    from megatron_zeppelin.integration.args import add_zeppelin_args
    from megatron_zeppelin.integration.batch import default_engine_factory
    p = add_zeppelin_args(argparse.ArgumentParser())
    assert p.parse_args(["--zeppelin-attention-kernel", "reference"]).zeppelin_attention_kernel == "reference"
    with pytest.raises(SystemExit):
        p.parse_args(["--zeppelin-attention-kernel", "flash3"])
    seen = []
    real = select.forward
    monkeypatch.setattr(select, "forward", lambda *a: seen.append(a[0]) or real(*a))
    plan = hand_plan([5, 3], Topology(1, 1), [0, 0])
    eng = default_engine_factory(plan, 0, None, None, None, kernel=Kernel("reference", "transformer_engine"))
    eng(*(torch.randn(8, 2, 4, dtype=F64) for _ in range(3)))
    assert seen == ["reference"]
