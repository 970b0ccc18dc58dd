"""Megatron-Core DDP with overlapped gradient reduction, for ``zeppelin compare-dp``.

runtime.wrap_ddp is the trainer's (no overlap); this one turns on overlap_grad_reduce with a chosen
bucket size so the comparison shows megatron-core's overlapped path. Reduces over parallel_state's
data-parallel group (set up by runtime.init_parallel).
"""

from __future__ import annotations


def wrap_mcore_ddp(model, overlap: bool = True, bucket_size: int = 40_000_000, distributed_optimizer: bool = False):
    """``distributed_optimizer``: megatron-core DDP's distributed-optimizer data path (contiguous
    param and grad buffers, bucketed reduce-scatter during the backward, ``start_param_sync``
    all-gathers parameters from the buffers)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=overlap,
                                               use_distributed_optimizer=distributed_optimizer,
                                               bucket_size=bucket_size)
    return DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=model)
