"""PyTorch DistributedDataParallel: bucketed all-reduce overlapped with the backward (averages)."""

from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel

from megatron_zeppelin.dp_study.base import Variant
from megatron_zeppelin.spec.words import DPVariant


class TorchDDP(Variant):
    """torch DDP: torch.nn.parallel.DistributedDataParallel, bucketed overlapped all-reduce"""
    name = DPVariant.TORCH_DDP
    averages = True
    overlap = True

    def wrap(self, model, group):
        return DistributedDataParallel(model, process_group=group, bucket_cap_mb=self.bucket_bytes / 2**20,
                                       broadcast_buffers=False)
