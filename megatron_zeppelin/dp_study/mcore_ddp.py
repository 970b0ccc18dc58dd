"""Megatron-Core DistributedDataParallel with overlap_grad_reduce: contiguous fp32 gradient buffers
(``main_grad``), bucket all-reduces launched during the backward. The megatron import lives in
integration/mcore_dp.py (only integration/ imports megatron)."""

from __future__ import annotations

import torch

from megatron_zeppelin.dp_study.base import Variant, make_adamw
from megatron_zeppelin.integration.mcore_dp import wrap_mcore_ddp  # imports megatron when it wraps
from megatron_zeppelin.spec.words import DPVariant


class McoreDDP(Variant):
    """megatron-core DDP: contiguous grad buffers, overlap_grad_reduce=True"""
    name = DPVariant.MCORE_DDP
    overlap = True

    def wrap(self, model, group):
        # megatron-core reduces over parallel_state's data-parallel group (all domain ranks here).
        return wrap_mcore_ddp(model, overlap=True, bucket_size=max(1, self.bucket_bytes // 4))

    def forward_module(self, module):
        # mcore DDP's forward only calls self.module (its reduction hooks sit on the parameters);
        # calling the model directly keeps torch's module trackers off the wrapper, whose
        # ``buffers`` attribute (a list of grad buffers) shadows nn.Module.buffers().
        return module.module

    def comm_groups(self, module, grad_group) -> list:
        # megatron-core reduces over parallel_state's groups, held by its bucket groups
        groups = {}
        for bg in getattr(module, "bucket_groups", []):
            for name in ("data_parallel_group", "intra_distributed_optimizer_instance_group"):
                g = getattr(bg, name, None)
                if g is not None:
                    groups[g.group_name] = g
        return list(groups.values()) or [grad_group]

    def zero_grad(self, module, optimizer) -> None:
        module.zero_grad_buffer()
        optimizer.zero_grad(set_to_none=True)

    def finish(self, module) -> None:
        module.finish_grad_sync()
        for p in module.parameters():
            if p.requires_grad:
                p.grad = p.main_grad.to(p.dtype)  # torch optimizers read .grad


class McoreDistOpt(McoreDDP):
    """megatron-core DDP's distributed-optimizer path: bucketed reduce-scatter, AdamW on this rank's
    shard of each bucket, parameter all-gather (start_param_sync)"""
    name = DPVariant.MCORE_DISTOPT
    zero_stage = 1

    # megatron-core's DistributedOptimizer class itself cannot run on CPU: its constructor accepts
    # only parameters whose .type() is torch.cuda.{Float,Half,BFloat16}Tensor (distrib_optimizer.py)
    # and MixedPrecisionOptimizer allocates its flags with device='cuda'. The data path below is
    # megatron-core's (the buffers, buckets, reduce-scatter and all-gather); the shard step is a torch
    # AdamW over views of the same shard ranges DistributedOptimizer would own.
    def wrap(self, model, group):
        import torch.distributed as dist

        module = wrap_mcore_ddp(model, overlap=True, bucket_size=max(1, self.bucket_bytes // 4),
                                distributed_optimizer=True)
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        self.shards = []  # (AdamW parameter viewing this rank's param shard, the bucket's grad buffer, range)
        for buf in module.buffers:
            for b in buf.buckets:
                n = b.grad_data.numel() // world  # mcore pads every bucket to a multiple of the DP size
                lo, hi = rank * n, (rank + 1) * n
                self.shards.append((torch.nn.Parameter(b.param_data[lo:hi]), b.grad_data, lo, hi))
        return module

    def optimizer(self, module, lr):
        return make_adamw([p for p, *_ in self.shards], lr)

    def finish(self, module) -> None:
        module.finish_grad_sync()  # reduce-scatter: this rank's shard of each bucket holds the sum
        for p, g, lo, hi in self.shards:
            p.grad = g[lo:hi]

    def after_step(self, module) -> None:
        module.start_param_sync(force_sync=True)  # all-gather the updated shards into every param
