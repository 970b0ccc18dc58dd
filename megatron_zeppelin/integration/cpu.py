"""The CPU shim: the few patches that let megatron-core 0.16.1 train on a machine without CUDA.

Used only when CUDA is absent (``install()`` is a no-op otherwise), so GPU runs are untouched.
What it patches and why (design.md "Megatron-Core facts"):

- ``torch.cuda.current_device`` returns the CPU device: rotary setup, the attention scratch
  buffer and DDP's buffers pass it as ``device=``.
- the CUDA RNG state tracker becomes a CPU one, seeded like ``model_parallel_cuda_manual_seed``
  (the local attention and TP weight init always fork it); activation recompute needs the same
  CPU get/set of the state.
- ``torch.cuda.synchronize`` / ``empty_cache`` become no-ops (DDP and timers call them).
- MoE: the alltoall token dispatcher makes a ``torch.cuda.Stream`` for its device-to-host copies
  of the split sizes and syncs on its event; on CPU one ``CpuStream`` stands for every stream
  (``current_stream`` is it, so the dispatcher sees no side stream) and its events are done.
  Its "device-to-host" helper converts split sizes to numpy only for CUDA tensors, and
  ``all_to_all_single`` refuses tensor split sizes: on CPU the helper converts CPU tensors too.
"""

from __future__ import annotations

import contextlib

import torch

_INSTALLED = False


def needed() -> bool:
    return not torch.cuda.is_available()


class CpuRNGStatesTracker:
    """Named CPU generator states with megatron's tracker interface (add / fork / get / set)."""

    def __init__(self, *args, **kwargs):
        self.reset()

    def reset(self):
        self.states_ = {}
        self.seeds_ = set()
        self._is_initialized = False

    def is_initialized(self):
        return self._is_initialized

    def get_states(self):
        return dict(self.states_)

    def set_states(self, states):
        self._is_initialized = True
        self.states_ = dict(states)

    def add(self, name, seed):
        self._is_initialized = True
        if seed in self.seeds_ or name in self.states_:
            raise RuntimeError(f"rng state {name} / seed {seed} already exists")
        self.seeds_.add(seed)
        orig = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(orig)

    @contextlib.contextmanager
    def fork(self, name="model-parallel-rng"):
        if name not in self.states_:
            raise RuntimeError(f"rng state {name} is not added")
        orig = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(orig)


class CpuEvent:
    """A finished event: CPU work is synchronous."""

    def synchronize(self):
        pass

    def query(self):
        return True

    def wait(self, stream=None):
        pass


class CpuStream:
    """The one CPU "stream": ordering is program order, so waits and events are no-ops."""

    def __new__(cls, *args, **kwargs):
        global _STREAM
        if _STREAM is None:
            _STREAM = super().__new__(cls)
        return _STREAM

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return CpuEvent()

    def synchronize(self):
        pass


_STREAM = None


def _host_copy(tensor, as_numpy=False, record_stream=False):
    """megatron's maybe_move_tensor_to_cpu for tensors already on the host."""
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.numpy()
    return tensor


def _get_rng_state(device=None, clone=False, graph_safe=False):
    return torch.get_rng_state()


def _set_rng_state(new_state, device=-1, graph_safe=False):
    torch.set_rng_state(new_state)


def install() -> bool:
    """Patch megatron-core for CPU if CUDA is absent; returns True when the shim is active."""
    global _INSTALLED
    if not needed():
        return False
    if _INSTALLED:
        return True
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.moe import token_dispatcher

    token_dispatcher.maybe_move_tensor_to_cpu = _host_copy
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.empty_cache = lambda *a, **k: None
    torch.cuda.Stream = CpuStream
    torch.cuda.current_stream = lambda *a, **k: CpuStream()
    torch.cuda.stream = lambda s=None: contextlib.nullcontext()
    # torch.cuda.manual_seed is already a lazy no-op without CUDA; the tracker must be CPU.
    mrandom._get_cuda_rng_state = _get_rng_state
    mrandom._set_cuda_rng_state = _set_rng_state
    mrandom.CudaRNGStatesTracker = CpuRNGStatesTracker
    mrandom._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.set_rng_state = lambda s, *a, **k: torch.set_rng_state(s)
    _INSTALLED = True
    return True


def seed(seed_value: int, tp_rank: int) -> None:
    """CPU version of ``model_parallel_cuda_manual_seed`` (same seeds per tracker name)."""
    from megatron.core.tensor_parallel import random as mrandom

    torch.manual_seed(seed_value)
    tracker = mrandom._CUDA_RNG_STATE_TRACKER
    tracker.reset()
    tracker.add(mrandom._DATA_PARALLEL_RNG_TRACKER_NAME, seed_value)
    tracker.add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, seed_value + 2718 + tp_rank)
    tracker.add(mrandom._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed_value + 1024)
