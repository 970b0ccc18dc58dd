"""ZeRO stages. ZeRO-1 and ZeRO-2 as the ZeRO paper defines them (Rajbhandari et al., SC'20, sec. 5),
in the layout of Megatron's distributed optimizer; ZeRO-3 is torch FSDP2.

Every parameter is a view into one flat parameter buffer cut into buckets (reverse registration
order, about the order the backward produces gradients); each bucket is padded to a multiple of W
and rank r owns the r-th 1/W of every bucket (its *shard*). One step:

1. backward: when a bucket's last gradient is accumulated, its reduce-scatter starts (async), so
   rank r receives the sum over ranks of its shard's gradient;
2. the optimizer (AdamW) steps only on this rank's shards: optimizer states are 1/W of the model;
3. the updated shards are all-gathered back into the flat parameter buffer (every rank again holds
   the full parameters for the next forward).

ZeRO-1 keeps the full gradient (a flat gradient buffer the parameters' ``.grad`` are views of, as
Megatron's ``main_grad``), reduce-scattered in place. ZeRO-2 keeps only its gradient shards: a
bucket's gradients are copied into a send buffer and freed as soon as the bucket is complete, and at
most one earlier bucket's send buffer stays alive while its reduce-scatter runs. Both keep full
parameters (ZeRO-3 shards those too). Traffic per step: reduce-scatter + all-gather = one
all-reduce's bytes, the same as DDP.

>>> ranges = shard_ranges(10, world=4)   # a bucket of 10 elements padded to 12: 3 per rank
>>> ranges
[(0, 3), (3, 6), (6, 9), (9, 12)]
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist

from megatron_zeppelin.dp_study.base import Variant, make_adamw
from megatron_zeppelin.dp_study.bucketed import make_buckets
from megatron_zeppelin.spec.words import DPVariant


def shard_ranges(numel: int, world: int):
    """[start, end) of each rank's shard in a bucket of ``numel`` elements padded to a multiple of W."""
    per = -(-numel // world)
    return [(r * per, (r + 1) * per) for r in range(world)]


class _Bucket:
    def __init__(self, params, start: int, world: int):
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.start = start
        self.size = shard_ranges(self.numel, world)[-1][1]  # padded
        self.pending = len(params)
        self.work = None
        self.send: Optional[torch.Tensor] = None  # ZeRO-2: the bucket's full gradient while it is reduced
        self.grad_shard: Optional[torch.Tensor] = None


class _ZeroSharded(Variant):
    overlap = True
    keep_full_grads = True  # ZeRO-1; ZeRO-2 frees them

    def wrap(self, model, group):
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        params = [p for p in model.parameters() if p.requires_grad]
        self.buckets: List[_Bucket] = []
        off = 0
        for b in make_buckets(params, self.bucket_bytes):
            bk = _Bucket(b, off, self.world)
            self.buckets.append(bk)
            off += bk.size
        dtype = params[0].dtype
        self.flat_param = torch.zeros(off, dtype=dtype)  # [sum of padded bucket sizes]
        self.flat_grad = torch.zeros(off, dtype=dtype) if self.keep_full_grads else None
        with torch.no_grad():
            for bk in self.buckets:
                o = bk.start
                for p in bk.params:
                    n = p.numel()
                    self.flat_param[o:o + n].copy_(p.detach().reshape(-1))
                    p.data = self.flat_param[o:o + n].view_as(p)  # the all-gather writes it in place
                    o += n
        # This rank's shard of every bucket: the optimizer's parameters, views of flat_param.
        self.shards = []
        for bk in self.buckets:
            s, e = shard_ranges(bk.numel, self.world)[self.rank]
            self.shards.append(torch.nn.Parameter(self.flat_param[bk.start + s:bk.start + e]))
        owner = {id(p): bk for bk in self.buckets for p in bk.params}
        for p in params:
            p.register_post_accumulate_grad_hook(lambda p, b=owner[id(p)]: self._ready(b))
        return model

    def optimizer(self, module, lr):
        return make_adamw(self.shards, lr)

    def zero_grad(self, module, optimizer) -> None:
        optimizer.zero_grad(set_to_none=True)
        if self.flat_grad is not None:
            self.flat_grad.zero_()
        for bk in self.buckets:
            bk.pending, bk.work, bk.send, bk.grad_shard = len(bk.params), None, None, None
            o = bk.start
            for p in bk.params:
                n = p.numel()
                # ZeRO-1: .grad is a view of the flat gradient buffer; autograd accumulates into it in place
                p.grad = self.flat_grad[o:o + n].view_as(p) if self.flat_grad is not None else None
                o += n
        self._inflight = None

    def _ready(self, bk: _Bucket) -> None:
        bk.pending -= 1
        if bk.pending == 0:
            self._launch(bk)

    def _launch(self, bk: _Bucket) -> None:
        per = bk.size // self.world
        if self.flat_grad is not None:
            send = self.flat_grad[bk.start:bk.start + bk.size]
        else:
            send = torch.zeros(bk.size, dtype=self.flat_param.dtype)
            o = 0
            for p in bk.params:
                n = p.numel()
                if p.grad is not None:
                    send[o:o + n].copy_(p.grad.reshape(-1))
                p.grad = None  # ZeRO-2: the full gradient of this bucket is not kept
                o += n
            if self._inflight is not None:  # at most one earlier send buffer alive
                self._inflight.work.wait()
                self._inflight.send = None
            self._inflight = bk
        bk.send = send
        bk.grad_shard = torch.empty(per, dtype=send.dtype)
        bk.work = dist.reduce_scatter_tensor(bk.grad_shard, send, group=self.group, async_op=True)

    def finish(self, module) -> None:
        for bk, shard in zip(self.buckets, self.shards):
            if bk.work is None:  # some parameter got no gradient this step
                self._launch(bk)
            bk.work.wait()
            bk.send = None
            shard.grad = bk.grad_shard  # [size / W]: the sum over ranks of this shard's gradient
        self._inflight = None

    def after_step(self, module) -> None:
        """All-gather the updated shards into every rank's full parameters."""
        works = []
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # same op; new name
        for bk, shard in zip(self.buckets, self.shards):
            out = self.flat_param[bk.start:bk.start + bk.size]
            works.append(gather(out, shard.detach().clone(), group=self.group, async_op=True))
        for w in works:
            w.wait()


class Zero1(_ZeroSharded):
    """ZeRO-1: reduce-scatter of gradients (full gradient kept), sharded AdamW, all-gather of parameters"""
    name = DPVariant.ZERO1
    zero_stage = 1
    keep_full_grads = True


class Zero2(_ZeroSharded):
    """ZeRO-2: as ZeRO-1, but each rank keeps only its gradient shard (bucket gradients freed once sent)"""
    name = DPVariant.ZERO2
    zero_stage = 2
    keep_full_grads = False


class Zero3(Variant):
    """ZeRO-3: FSDP2 fully_shard(reshard_after_forward=True): params, grads, optimizer states sharded"""
    name = DPVariant.ZERO3
    zero_stage = 3
    averages = True
    overlap = True

    def wrap(self, model, group):
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in model.decoder.layers:  # megatron GPTModel: one FSDP unit per transformer layer
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
        return model
