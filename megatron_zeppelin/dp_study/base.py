"""The interface every data-parallel variant implements, and the names of the variants.

A variant wraps a freshly built model for one process group, builds its optimizer, and turns the
local gradients of one backward into the domain's summed gradients. ``loss_scale(world)`` is the
factor the local loss is multiplied by so that a variant whose collective *averages* (torch DDP,
FSDP) yields the same summed gradient as one that sums (naive, bucketed, megatron-core DDP with
per-token loss): averaging over W ranks after scaling by W is exact in float32 for W = 1, 2, 4.
The variants' modules import this one; ``get_variant`` (variants.py) builds one by name.

>>> [v for v in VARIANTS]
['single', 'naive', 'bucketed', 'torch_ddp', 'mcore_ddp', 'mcore_distopt', 'zero1', 'zero2', 'zero3']
"""

from __future__ import annotations

import torch

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.words import DPVariant

# name -> (module under megatron_zeppelin.dp_study, class name); order = order in tables and plots
VARIANTS = {
    DPVariant.SINGLE: ("naive", "SingleProcess"),
    DPVariant.NAIVE: ("naive", "NaiveDP"),
    DPVariant.BUCKETED: ("bucketed", "BucketedDP"),
    DPVariant.TORCH_DDP: ("torch_ddp", "TorchDDP"),
    DPVariant.MCORE_DDP: ("mcore_ddp", "McoreDDP"),
    DPVariant.MCORE_DISTOPT: ("mcore_ddp", "McoreDistOpt"),
    DPVariant.ZERO1: ("zero", "Zero1"),
    DPVariant.ZERO2: ("zero", "Zero2"),
    DPVariant.ZERO3: ("zero", "Zero3"),
}


class VariantError(ZeppelinError):
    pass


def make_adamw(params, lr: float, **kw):
    # foreach=False: the same per-tensor update for plain tensors and FSDP's DTensor shards.
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, foreach=False, **kw)


class Variant:
    name = "base"
    zero_stage = 0  # 0 = replicated optimizer states; 1/2/3 = ZeRO stage
    averages = False  # True: the gradient collective divides by the world size
    overlap = False  # True: gradient communication runs during the backward

    def __init__(self, bucket_bytes: int = 1 << 16):
        self.bucket_bytes = int(bucket_bytes)  # small: the tiny GPT has ~0.4 MB of fp32 gradients

    def loss_scale(self, world: int) -> int:
        return world if self.averages else 1

    def wrap(self, model: torch.nn.Module, group) -> torch.nn.Module:
        """Return the module to call for forward/backward (may be ``model`` itself)."""
        raise NotImplementedError

    def forward_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """What the forward calls (a wrapper whose forward only delegates may be skipped)."""
        return module

    def optimizer(self, module: torch.nn.Module, lr: float):
        return make_adamw([p for p in module.parameters() if p.requires_grad], lr)

    def zero_grad(self, module, optimizer) -> None:
        optimizer.zero_grad(set_to_none=True)

    def finish(self, module) -> None:
        """After backward: the summed (or W-scaled averaged) gradients are ready for the optimizer."""

    def comm_groups(self, module, grad_group) -> list:
        """The process groups this variant's gradient / parameter collectives run on."""
        return [grad_group]

    def after_step(self, module) -> None:
        """After the optimizer step: e.g. ZeRO-1/2's all-gather of the updated parameter shards."""

    def describe(self) -> str:
        return self.__doc__.strip().splitlines()[0] if self.__doc__ else self.name
