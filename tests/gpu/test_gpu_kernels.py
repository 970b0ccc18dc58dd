"""GPU check of every kernel backend present against the float64 oracle (skipped without CUDA).

Per backend (torch_flash always; te and flash_attn when installed): forward and backward in bf16 and
fp16, GQA and MHA, odd lengths, zigzag chunks of a G-member ring run on one GPU (one attend_blocks call
per ring step for every member, each member's block its own K/V tensor, as the engine calls a queue
step of several rings; members that hold no token), the local queue (G=1: one causal varlen call for
all documents), and an offset-causal block. Run with ``python -m pytest -m gpu tests/gpu``.
"""

import importlib.util

import pytest
import torch

from megatron_zeppelin.attention.kernels import Kernel, block_backward, block_forward
from megatron_zeppelin.attention.kernels.checks import zigzag_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _backend(name, package):
    missing = package is not None and importlib.util.find_spec(package) is None
    return pytest.param(name, id=name, marks=pytest.mark.skipif(missing, reason=f"{package} not installed"))


BACKENDS = [_backend("torch_flash", None), _backend("te", "transformer_engine"), _backend("flash_attn", "flash_attn")]
TOL = {torch.bfloat16: 3e-2, torch.float16: 1e-2}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4)], ids=["gqa", "mha"])
@pytest.mark.parametrize("lengths,members", [([1000, 333, 17, 1], 1), ([2048, 777, 5], 4), ([3, 129], 2)],
                         ids=["local_queue", "zigzag4_odd", "zigzag2_empty_member"])
def test_backend_matches_float64(backend, dtype, heads, kv_heads, lengths, members):
    errs = zigzag_case(backend, lengths, members, heads, kv_heads, dim=64, dtype=dtype, device="cuda")
    assert max(errs.values()) < TOL[dtype], errs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("off", [None, 0, 37, -5], ids=["full", "diag", "prefix", "late"])
def test_offset_block_matches_reference(backend, off):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(200, 8, 64, generator=g).cuda()
    k = torch.randn(237, 2, 64, generator=g).cuda()
    v = torch.randn(237, 2, 64, generator=g).cuda()
    do = torch.randn(200, 8, 64, generator=g).cuda()
    ro, rl = block_forward(q.double(), k.double(), v.double(), 0.125, off, "reference")
    o, lse = block_forward(q.bfloat16(), k.bfloat16(), v.bfloat16(), 0.125, off, Kernel(backend))
    seen = torch.isfinite(rl)
    assert ((o.double() - ro).abs().max() / ro.abs().max()).item() < 3e-2
    assert (lse[seen].double() - rl[seen]).abs().max().item() < 3e-2 and torch.isneginf(lse[~seen]).all()
    ref = block_backward(do.double(), q.double(), k.double(), v.double(), ro, rl, 0.125, off, "reference")
    got = block_backward(do.bfloat16(), q.bfloat16(), k.bfloat16(), v.bfloat16(), o, lse, 0.125, off, backend)
    for a, b in zip(got, ref):
        assert ((a.double() - b).abs().max() / b.abs().max()).item() < 3e-2


def test_auto_picks_a_flash_kernel_on_cuda():
    assert Kernel("auto", "local").resolve(torch.device("cuda"), torch.bfloat16) == "torch_flash"
    te = importlib.util.find_spec("transformer_engine") is not None
    want = "te" if te else "torch_flash"
    assert Kernel("auto", "transformer_engine").resolve(torch.device("cuda"), torch.bfloat16) == want
