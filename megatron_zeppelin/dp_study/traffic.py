"""Bytes communicated by the collectives of one process group, measured where they are issued.

Since torch 2.0 every ProcessGroup collective -- called from Python, or from C++ inside torch DDP's
reducer, megatron-core DDP or FSDP2 -- goes through a dispatcher op in the ``c10d`` namespace, so a
TorchDispatchMode sees each one with its tensors and its process group. ``CollectiveCounter``
records, for the ops on one group: the op, the collective's size (the larger of its input and
output buffers: the full vector of an all-reduce, reduce-scatter or all-gather, as nccl-tests count
"size") and the bytes one rank sends with ring algorithms (all-reduce 2(W-1)/W x size,
reduce-scatter and all-gather (W-1)/W x size, broadcast: size from the root).

>>> ring_sent_bytes("allreduce_", 100, 4), ring_sent_bytes("_reduce_scatter_base_", 100, 4)
(150.0, 75.0)
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def ring_sent_bytes(op: str, size: int, world: int) -> float:
    if world <= 1:
        return 0.0
    if op.startswith("allreduce"):
        return 2.0 * (world - 1) / world * size
    if op.startswith("broadcast"):
        return float(size)
    return (world - 1) / world * size  # reduce-scatter, all-gather


def _tensor_bytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_tensor_bytes(y) for y in x)
    return 0


def _group_name(args) -> str:
    for a in args:
        if isinstance(a, torch.ScriptObject) and "ProcessGroup" in str(a._type()):
            return torch._C._distributed_c10d.ProcessGroup.unbox(a).group_name
    return ""


class CollectiveCounter(TorchDispatchMode):
    """Count the collectives on ``groups`` (one process group or several) while active."""

    def __init__(self, groups, world: int):
        super().__init__()
        groups = groups if isinstance(groups, (list, tuple)) else [groups]
        self.names, self.world = {g.group_name for g in groups}, world
        self.ops: List[tuple] = []  # (op, size bytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d" and _group_name(args) in self.names:
            tensors = [a for a in args if isinstance(a, (torch.Tensor, list, tuple))]
            size = max((_tensor_bytes(a) for a in tensors), default=0)
            self.ops.append((func._opname, size))
        return func(*args, **(kwargs or {}))

    def summary(self) -> Dict[str, float]:
        """{'collectives': n, 'size_bytes': total size, 'sent_bytes': ring bytes sent, 'ops': {op: n}}"""
        return {"collectives": len(self.ops), "size_bytes": sum(s for _, s in self.ops),
                "sent_bytes": sum(ring_sent_bytes(o, s, self.world) for o, s in self.ops),
                "ops": dict(Counter(o for o, _ in self.ops))}
