"""GPU checks (skipped without CUDA): the engine on NCCL equals the reference (kernels: test_gpu_kernels.py).

Run on a GPU machine with `python -m pytest -m gpu tests/gpu`.
"""

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _rel(a, b):
    return ((a.double().cpu() - b.double().cpu()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def _engine_on_gpu(rank, world, lengths, where, nodes, gpus):
    from megatron_zeppelin.attention.engine import AttentionEngine
    from megatron_zeppelin.attention.reference import reference_attention
    from megatron_zeppelin.attention.testing import hand_plan, rank_inputs
    from megatron_zeppelin.spec.topology import Topology
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    plan = hand_plan(lengths, Topology(nodes, gpus), where)
    (q, k, v, dout), idx = rank_inputs(plan, rank, 8, 2, 64, torch.float32, seed=1)
    eng = AttentionEngine(plan, rank, dist.group.WORLD)
    lq, lk, lv = (x[idx].cuda().bfloat16().requires_grad_(True) for x in (q, k, v))
    out = eng(lq, lk, lv)
    out.backward(dout[idx].cuda().bfloat16())
    rq, rk, rv = (x.double().requires_grad_(True) for x in (q, k, v))
    ref = reference_attention(rq, rk, rv, plan.lengths)
    ref.backward(dout.double())
    return [_rel(a, b[idx]) for a, b in ((out, ref), (lq.grad, rq.grad), (lk.grad, rk.grad), (lv.grad, rv.grad))]


@pytest.mark.parametrize("where", [[0, 0, 0, 0, 0], [(0,), 0, (0,), 0, (0,)]], ids=["local_queue", "ring_and_local"])
def test_engine_on_one_gpu(where):
    # ring_and_local: a one-member ring's step (each document's later chunk sees its earlier one fully
    # and itself causally: one bottom-right causal call) and the local queue, on one GPU
    from megatron_zeppelin.distributed.launch import run_distributed
    errs = run_distributed(_engine_on_gpu, 1, [300, 17, 1024, 50, 3], where, 1, 1, backend="nccl", timeout=300)
    assert max(errs[0]) < 3e-2


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_engine_ring_on_two_gpus():
    from megatron_zeppelin.distributed.launch import run_distributed
    errs = run_distributed(_engine_on_gpu, 2, [2048, 333, 17], [(0, 1), 1, 0], 1, 2, backend="nccl", timeout=300)
    assert max(max(e) for e in errs) < 3e-2
