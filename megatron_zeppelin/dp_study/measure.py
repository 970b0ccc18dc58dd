"""Measured memory of one training step on CPU.

``peak_step_bytes`` runs one step under torch's MemTracker (torch.distributed._tools.mem_tracker: a
TorchDispatchMode that follows every tensor storage the step allocates or resizes, plus the
parameters, gradients and optimizer states that exist before it) and returns the peak of live
tracked bytes by category. It counts tensor storages only (not the Python interpreter, libraries or
gloo's internal buffers); ``rss_peak_bytes`` is the coarse process-level number (ru_maxrss).
megatron-core DDP's contiguous gradient buffer is not a ``.grad`` and is added by hand.
"""

from __future__ import annotations

import resource
import sys
from typing import Callable, Dict

import torch


def rss_peak_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)  # Linux reports KiB


def mcore_grad_buffer_bytes(module) -> int:
    total = 0
    bufs = getattr(module, "buffers", None)
    if not isinstance(bufs, (list, tuple)):  # nn.Module.buffers is a method; mcore DDP's is a list
        return 0
    for buf in bufs:
        g = getattr(buf, "grad_data", None)
        if g is not None:
            total += g.numel() * g.element_size()
    return total


def peak_step_bytes(step: Callable[[], None], module, optimizer) -> Dict[str, int]:
    """Run ``step()`` once under MemTracker; peak live bytes per category and 'total'."""
    from torch.distributed._tools.mem_tracker import MemTracker

    mt = MemTracker()
    # ZeroRedundancyOptimizer keeps its shard's states in the inner ``optim``
    mt.track_external(getattr(module, "module", module), getattr(optimizer, "optim", optimizer))  # the model inside a DDP wrapper
    with mt:
        step()
    snap = mt.get_tracker_snapshot("peak")
    dev = snap.get(torch.device("cpu"), {})
    out = {str(k).split(".")[-1].lower(): int(v) for k, v in dev.items()}
    out.setdefault("total", int(dev.get("Total", 0)) if "Total" in dev else sum(out.values()))
    extra = mcore_grad_buffer_bytes(module)
    if extra:
        out["grad"] = out.get("grad", 0) + extra
        out["total"] += extra
    return out
