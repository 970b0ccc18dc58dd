"""Naive DP: one all-reduce of every gradient, flattened into one buffer, after the whole backward
(no overlap of communication with computation)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron_zeppelin.dp_study.base import Variant, VariantError
from megatron_zeppelin.spec.words import DPVariant


class NaiveDP(Variant):
    """naive DP: one flat all-reduce after the whole backward"""
    name = DPVariant.NAIVE

    def wrap(self, model, group):
        self.group = group
        self.params = [p for p in model.parameters() if p.requires_grad]
        return model

    def finish(self, module) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])  # [total params]: one message
        dist.all_reduce(flat, group=self.group)
        off = 0
        for p, g in zip(self.params, grads):
            n = g.numel()
            p.grad = flat[off:off + n].view_as(p)  # views into the reduced buffer
            off += n


class SingleProcess(Variant):
    """plain single-process training: no wrapper, no communication (the baseline; one rank only)"""
    name = DPVariant.SINGLE

    def wrap(self, model, group):
        if group is not None and dist.get_world_size(group) != 1:
            raise VariantError("variant 'single' runs on one rank only (drop it from --variants or use --ranks 1)")
        return model
