"""Megatron-Core DistributedDataParallel with overlap_grad_reduce: contiguous fp32 gradient buffers
(``main_grad``), bucket all-reduces launched during the backward. The megatron import lives in
integration/mcore_dp.py (only integration/ imports megatron)."""

from __future__ import annotations

from .base import Variant


class McoreDDP(Variant):
    """megatron-core DDP: contiguous grad buffers, overlap_grad_reduce=True"""
    name = "mcore_ddp"
    overlap = True

    def wrap(self, model, group):
        from ..integration.mcore_dp import wrap_mcore_ddp
        # megatron-core reduces over parallel_state's data-parallel group (all domain ranks here).
        return wrap_mcore_ddp(model, overlap=True, bucket_size=max(1, self.bucket_bytes // 4))

    def forward_module(self, module):
        # mcore DDP's forward only calls self.module (its reduction hooks sit on the parameters);
        # calling the model directly keeps torch's module trackers off the wrapper, whose
        # ``buffers`` attribute (a list of grad buffers) shadows nn.Module.buffers().
        return module.module

    def zero_grad(self, module, optimizer) -> None:
        module.zero_grad_buffer()
        optimizer.zero_grad(set_to_none=True)

    def finish(self, module) -> None:
        module.finish_grad_sync()
        for p in module.parameters():
            if p.requires_grad:
                p.grad = p.main_grad.to(p.dtype)  # torch optimizers read .grad
