"""The CPU shim for Megatron-LM's own training loop (``megatron.training.pretrain``), no CUDA.

``install()`` is a no-op where CUDA exists, so GPU runs are untouched. Megatron-LM's training loop
assumes CUDA in a few places; on CPU (gloo ranks, the tests) this module answers each of them:

- ``typing.override`` from typing_extensions (megatron.training names it; Python 3.11 lacks it);
- ``TORCHDYNAMO_DISABLE=1``: the jit warm-up compiles fused kernels for "CUDA";
- megatron-core's part (``cpu.install``): ``torch.cuda.current_device`` -> the CPU device, the CPU RNG
  state tracker, no-op ``synchronize`` / ``empty_cache``;
- ``torch.cuda.is_available()`` True and ``device_count()`` 1 (``initialize.py`` asserts CUDA and
  skips model-parallel set-up without a device), no-op ``set_device``, memory statistics 0, device
  properties (compute capability 9.0: ``validate_args`` reads it with TP > 1), and
  Event / Stream stand-ins (timers and the logging path use them);
- a device of compute capability (0, 0) and ``CUDA_DEVICE_MAX_CONNECTIONS=1``: with TP or CP,
  ``validate_args`` reads the device's architecture and then asserts that setting (meaningless on
  the CPU), so ``--tensor-model-parallel-size 2`` runs;
- a TorchFunctionMode that maps ``device='cuda'`` to the CPU and makes ``Tensor.cuda()`` /
  ``pin_memory()`` return the tensor (loss reductions and checkpoint loading create CUDA tensors);
- gradient clipping by the total norm without its ``torch.cuda.FloatTensor`` assertion (same math),
  so ``--clip-grad`` works and the grad norm is logged.

Flags the CPU run needs on Megatron's side (not patched here): the ``--no-*-fusion`` flags (fused
kernels are CUDA-only); tests/megatron_lm/ shows the full command.
"""

from __future__ import annotations

import os
import time

import torch
from torch.overrides import TorchFunctionMode

from megatron_zeppelin.integration import cpu

_MODE = None
_CPU = torch.device("cpu")


def _is_cuda(d) -> bool:
    if isinstance(d, torch.device):
        return d.type == "cuda"
    return isinstance(d, str) and d.startswith("cuda")


class CudaToCpu(TorchFunctionMode):
    """Every tensor Megatron asks for on "cuda" is made on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.cuda, torch.Tensor.pin_memory):
            return args[0]
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = _CPU
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], _CPU) + tuple(args[2:])
        return func(*args, **kwargs)


class _Event:
    """torch.cuda.Event stand-in: wall-clock time stamps."""

    def __init__(self, *a, **k):
        self.t = None

    def record(self, *a, **k):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def query(self):
        return True

    def wait(self, *a, **k):
        pass

    def elapsed_time(self, end) -> float:
        return (end.t - self.t) * 1000.0


class _Properties:
    """torch.cuda.get_device_properties stand-in."""
    name, major, minor, total_memory, multi_processor_count = "cpu", 9, 0, 0, 1


class _Stream:
    def __init__(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def wait_stream(self, *a, **k):
        pass

    def wait_event(self, *a, **k):
        pass

    def record_event(self, *a, **k):
        e = _Event()
        e.record()
        return e

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Properties:
    """torch.cuda.get_device_properties stand-in: no CUDA architecture (major 0), no device memory."""
    name, major, minor, total_memory, multi_processor_count = "cpu (zeppelin CPU shim)", 0, 0, 0, 1


def clip_grad_by_total_norm_fp32(parameters, max_norm, total_norm, use_decoupled_grad: bool = False):
    """megatron-core's function of that name on CPU tensors: scale grads in place when over max_norm."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = [getattr(p, attr) for p in parameters if getattr(p, attr, None) is not None]
    coeff = max_norm / (total_norm + 1.0e-6)
    if isinstance(coeff, torch.Tensor):
        coeff = coeff.clamp_max(1.0)
    elif coeff >= 1.0:
        return
    for g in grads:
        g.detach().mul_(coeff)


def install() -> bool:
    """Patch torch/megatron for Megatron-LM's training loop on CPU; True when the shim is active.

    Call before importing ``megatron.training``."""
    global _MODE
    if _MODE is not None:
        return True
    if torch.cuda.is_available():
        return False
    import typing

    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    cpu.install()  # megatron-core's part; must run while is_available() is still False
    c = torch.cuda
    c.is_available = lambda: True
    c.device_count = lambda: 1
    c.set_device = lambda *a, **k: None
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(c, name, lambda *a, **k: 0)
    c.get_device_properties = lambda *a, **k: _Properties()
    c.get_device_capability = lambda *a, **k: (_Properties.major, _Properties.minor)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # validate_args asserts it for TP / CP
    c.reset_peak_memory_stats = lambda *a, **k: None
    c.memory_stats = lambda *a, **k: {}
    c.mem_get_info = lambda *a, **k: (0, 0)
    # validate_args reads the device's compute capability with TP or CP > 1 (a Hopper-like answer:
    # below 10, which only selects a warning)
    c.get_device_properties = lambda *a, **k: _Properties()
    c.Event = _Event
    c.Stream = _Stream
    c.current_stream = lambda *a, **k: _Stream()
    c.default_stream = lambda *a, **k: _Stream()
    c.stream = lambda s=None: _Stream()
    from megatron.core.optimizer import optimizer as mopt

    mopt.clip_grad_by_total_norm_fp32 = clip_grad_by_total_norm_fp32
    _MODE = CudaToCpu()
    _MODE.__enter__()  # for the life of the process: Megatron creates CUDA tensors anywhere
    return True
