"""ZeRO stages. ZeRO-1: gradients all-reduced by torch DDP, optimizer states sharded by torch's
ZeroRedundancyOptimizer (each rank updates its share, then broadcasts it). ZeRO-2 and ZeRO-3: torch
FSDP2 ``fully_shard`` per transformer layer and at the root; gradients reduce-scattered, optimizer
states and gradients sharded; ZeRO-3 frees the gathered parameters after each layer's forward
(reshard_after_forward=True) and gathers them again in the backward, ZeRO-2 keeps them gathered
from forward to backward (reshard_after_forward=False, FSDP's SHARD_GRAD_OP). Note: FSDP2 keeps
parameters sharded *between* steps in both cases, so its "ZeRO-2" also saves parameter memory at rest.
"""

from __future__ import annotations

from torch.distributed.optim import ZeroRedundancyOptimizer

from .base import Variant, make_adamw
from .torch_ddp import TorchDDP


class Zero1(TorchDDP):
    """ZeRO-1: torch DDP + ZeroRedundancyOptimizer (optimizer states sharded)"""
    name = "zero1"
    zero_stage = 1

    def wrap(self, model, group):
        self.group = group
        return super().wrap(model, group)

    def optimizer(self, module, lr):
        import torch
        params = [p for p in module.parameters() if p.requires_grad]
        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, process_group=self.group,
                                       lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, foreach=False)


class _FSDP(Variant):
    averages = True
    overlap = True
    reshard_after_forward = True

    def wrap(self, model, group):
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in model.decoder.layers:  # megatron GPTModel: one FSDP unit per transformer layer
            fully_shard(layer, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        return model

    def optimizer(self, module, lr):
        return make_adamw([p for p in module.parameters() if p.requires_grad], lr)


class Zero2(_FSDP):
    """ZeRO-2: FSDP2 fully_shard(reshard_after_forward=False): grads + optimizer states sharded"""
    name = "zero2"
    zero_stage = 2
    reshard_after_forward = False


class Zero3(_FSDP):
    """ZeRO-3: FSDP2 fully_shard(reshard_after_forward=True): params, grads, optimizer states sharded"""
    name = "zero3"
    zero_stage = 3
