"""Overlapped (bucketed) DP: gradients grouped into buckets in backward order; a bucket's
all-reduce starts (async) as soon as its last gradient is accumulated, while the backward continues.

>>> import torch
>>> ps = [torch.nn.Parameter(torch.zeros(n)) for n in (4, 4, 8, 2)]
>>> [[p.numel() for p in b] for b in make_buckets(ps, bucket_bytes=32)]  # reverse order, <= 8 floats
[[2], [8], [4, 4]]
"""

from __future__ import annotations

from typing import List

import torch
import torch.distributed as dist

from megatron_zeppelin.dp_study.base import Variant
from megatron_zeppelin.spec.words import DPVariant


def make_buckets(params: List[torch.nn.Parameter], bucket_bytes: int) -> List[List[torch.nn.Parameter]]:
    """Parameters in reverse registration order (about the order the backward produces their
    gradients), cut into buckets of at most ``bucket_bytes`` (a bigger parameter gets its own)."""
    buckets, cur, size = [], [], 0
    for p in reversed(params):
        nb = p.numel() * p.element_size()
        if cur and size + nb > bucket_bytes:
            buckets.append(cur)
            cur, size = [], 0
        cur.append(p)
        size += nb
    if cur:
        buckets.append(cur)
    return buckets


class _Bucket:
    def __init__(self, params):
        self.params = params
        self.flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype)
        self.pending = len(params)
        self.work = None

    def launch(self, group):
        off = 0
        for p in self.params:  # copy grads into the flat bucket [sum numel]
            n = p.numel()
            self.flat[off:off + n].copy_(p.grad.reshape(-1) if p.grad is not None else torch.zeros(n))
            off += n
        self.work = dist.all_reduce(self.flat, group=group, async_op=True)


class BucketedDP(Variant):
    """overlapped DP: bucketed async all-reduce from gradient hooks during the backward"""
    name = DPVariant.BUCKETED
    overlap = True

    def wrap(self, model, group):
        self.group = group
        params = [p for p in model.parameters() if p.requires_grad]
        self.buckets = [_Bucket(b) for b in make_buckets(params, self.bucket_bytes)]
        owner = {id(p): b for b in self.buckets for p in b.params}
        for p in params:
            p.register_post_accumulate_grad_hook(lambda p, b=owner[id(p)]: self._ready(b))
        return model

    def _ready(self, bucket: _Bucket) -> None:
        bucket.pending -= 1
        if bucket.pending == 0:
            bucket.launch(self.group)

    def zero_grad(self, module, optimizer) -> None:
        optimizer.zero_grad(set_to_none=True)
        for b in self.buckets:
            b.pending, b.work = len(b.params), None

    def finish(self, module) -> None:
        for b in self.buckets:
            if b.work is None:  # a parameter got no gradient this step: reduce the bucket now
                b.launch(self.group)
            b.work.wait()
            off = 0
            for p in b.params:
                n = p.numel()
                p.grad = b.flat[off:off + n].view_as(p).clone()
                off += n
