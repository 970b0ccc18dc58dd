"""Which kernel runs: ``--zeppelin-attention-kernel`` (default ``auto``), ``--transformer-impl``, device,
dtype and what is installed.

``auto`` on CUDA with fp16/bf16: ``te`` when ``--transformer-impl transformer_engine`` and Transformer
Engine imports (what Megatron users run), else ``torch_flash`` (torch's varlen FlashAttention-2, no
extra package). flash-attn is used when asked for by name (``flash_attn``). On CPU: ``cpu_flash`` for
float32/float64. Float32/float64 on CUDA and half precision on CPU have no flash kernel: ``auto``
falls back to ``reference`` (explicit matmuls per sequence; an oracle, slow and memory-hungry on
long documents). A kernel asked for by name that cannot run raises a KernelError naming the flag.

>>> resolve("auto", torch.device("cpu"), torch.float32)
'cpu_flash'
>>> resolve("auto", torch.device("cuda"), torch.bfloat16, transformer_impl="local")
'torch_flash'
>>> resolve("reference", torch.device("cuda"), torch.bfloat16)
'reference'
"""

from __future__ import annotations

import importlib.util
from typing import Optional

import torch

from megatron_zeppelin.attention.kernels import cpu, flash_attn, te, torch_flash
from megatron_zeppelin.attention.kernels.varlen import KernelError, Varlen
from megatron_zeppelin.spec.words import KernelBackend

BACKENDS = tuple(k.value for k in KernelBackend)  # the plain words: --zeppelin-attention-kernel's choices
_CUDA_ONLY = (KernelBackend.TORCH_FLASH, KernelBackend.TE, KernelBackend.FLASH_ATTN)
HALF = (torch.float16, torch.bfloat16)


def te_installed() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def resolve(backend: str, device: torch.device, dtype: torch.dtype, transformer_impl: Optional[str] = None
            ) -> KernelBackend:
    if backend not in BACKENDS:
        raise KernelError(f"unknown attention kernel {backend!r} (--zeppelin-attention-kernel: one of "
                          f"{', '.join(BACKENDS)})")
    backend = KernelBackend(backend)
    cuda = device.type == "cuda"
    if backend == KernelBackend.AUTO:
        if cuda and dtype in HALF:
            return (KernelBackend.TE if transformer_impl == "transformer_engine" and te_installed()
                    else KernelBackend.TORCH_FLASH)
        if not cuda and dtype in (torch.float32, torch.float64):
            return KernelBackend.CPU_FLASH
        return KernelBackend.REFERENCE
    if backend in _CUDA_ONLY and not (cuda and dtype in HALF):
        raise KernelError(f"--zeppelin-attention-kernel {backend} runs on CUDA in fp16/bf16, not {device.type} "
                          f"{dtype}: use auto, reference, or train with --bf16/--fp16")
    if backend == KernelBackend.CPU_FLASH and cuda:
        raise KernelError("--zeppelin-attention-kernel cpu_flash is the CPU kernel: use auto on CUDA")
    return backend


def forward(backend: str, q, k, v, spec: Varlen, scale: float):
    """(out [total_q, h, d] in q's dtype, lse [total_q, h] float32, float64 for float64 input)."""
    spec.check(q, k, v)
    if backend == KernelBackend.TORCH_FLASH:
        out, lse = torch_flash.forward(q, k, v, spec, scale)
    elif backend == KernelBackend.TE:
        out, lse = te.forward(q, k, v, spec, scale)
    elif backend == KernelBackend.FLASH_ATTN:
        out, lse = flash_attn.forward(q, k, v, spec, scale)
    else:
        return cpu.forward(backend, q, k, v, spec, scale)
    return out, lse.float()


def backward(backend: str, dout, q, k, v, out, lse, spec: Varlen, scale: float):
    """(dq, dk, dv) of one call, from the *final* out and lse of its query rows."""
    spec.check(q, k, v)
    if backend == KernelBackend.TORCH_FLASH:
        return torch_flash.backward(dout, q, k, v, out, lse, spec, scale)
    if backend == KernelBackend.TE:
        return te.backward(dout, q, k, v, out, lse, spec, scale)
    if backend == KernelBackend.FLASH_ATTN:
        return flash_attn.backward(dout, q, k, v, out, lse, spec, scale)
    return cpu.backward(backend, dout, q, k, v, out, lse, spec, scale)
