"""One training step on a planned micro-batch, and the pieces the trainer and the tests share.

Loss is megatron's per-token convention: each rank sums the losses of its linear-layout tokens and
divides by the *domain's* token count; DDP sums gradients (calculate_per_token_loss), so unequal
token counts per rank give exactly the gradients of one big batch.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
import torch.distributed as dist

from megatron_zeppelin.integration.batch import RankBatch


def forward_loss_sum(model, batch: RankBatch) -> torch.Tensor:
    """Sum of this rank's per-token losses (differentiable)."""
    # tokens/position_ids [1, t_att]; labels [1, t_lin]; returns per-token loss [1, t_lin]
    loss = model(batch.tokens, batch.position_ids, None, labels=batch.labels,
                 packed_seq_params=batch.packed_seq_params)
    return loss[:, :batch.label_tokens].sum()  # pad rows (empty linear layout) carry no loss


def grad_norm(params: Iterable[torch.nn.Parameter], tp_group=None, tp_rank: int = 0, ep_group=None) -> float:
    """Global L2 norm of ``main_grad`` (or ``grad``): TP-split parameters counted on every TP rank,
    replicated ones once; MoE experts (megatron marks them ``allreduce=False``) live on one rank of
    the expert-parallel group, so their squares are summed over ``ep_group``."""
    sq = torch.zeros((), dtype=torch.float64)
    sq_experts = torch.zeros((), dtype=torch.float64)
    for p in params:
        g = getattr(p, "main_grad", None)
        g = p.grad if g is None else g
        if g is None:
            continue
        if getattr(p, "tensor_model_parallel", False) or tp_rank == 0:
            part = g.detach().double().pow(2).sum().cpu()
            if getattr(p, "allreduce", True):
                sq += part
            else:
                sq_experts += part
    if ep_group is not None and dist.get_world_size(ep_group) > 1:
        dist.all_reduce(sq_experts, group=ep_group)
    sq += sq_experts
    if tp_group is not None and dist.get_world_size(tp_group) > 1:
        dist.all_reduce(sq, group=tp_group)
    return math.sqrt(float(sq))


def allreduce_sequence_parallel_grads(params, tp_group) -> None:
    """Sum over the TP group the gradients of weights used on 1/T of the tokens each (norms in
    megatron's sequence-parallel regions, marked ``sequence_parallel``): what megatron's
    finalize_model_grads does after the DP reduction. One flat all-reduce."""
    if tp_group is None or dist.get_world_size(tp_group) == 1:
        return
    grads = [p.main_grad for p in params if getattr(p, "sequence_parallel", False)]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=tp_group)
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))


def clip_(params, max_norm: float, norm: float) -> None:
    if max_norm > 0 and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for p in params:
            g = getattr(p, "main_grad", None)
            g = p.grad if g is None else g
            if g is not None:
                g.mul_(scale)


def train_step(ddp_model, optimizer, batch: RankBatch, *, domain_group, tp_group=None, tp_rank: int = 0,
               clip_grad: float = 1.0, scheduler=None, ep_group=None) -> dict:
    """Forward, backward, gradient sync, clip, optimizer step. Returns the domain mean loss."""
    ddp_model.zero_grad_buffer()
    optimizer.zero_grad(set_to_none=True)
    local = forward_loss_sum(ddp_model, batch)
    (local / batch.domain_tokens).backward()
    ddp_model.finish_grad_sync()
    params = [p for p in ddp_model.parameters() if p.requires_grad]
    allreduce_sequence_parallel_grads(params, tp_group)
    for p in params:
        p.grad = p.main_grad.to(p.dtype)  # torch optimizers read .grad
    norm = grad_norm(params, tp_group, tp_rank, ep_group)
    clip_(params, clip_grad, norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    total = local.detach().double().reshape(1)
    dist.all_reduce(total, group=domain_group)
    return {"loss": float(total) / batch.domain_tokens, "grad_norm": norm}


def reference_step(model, optimizer, docs, *, clip_grad: float = 1.0, scheduler=None) -> dict:
    """The oracle: the stock model on one process, each document alone (causal), same loss."""
    optimizer.zero_grad(set_to_none=True)
    total_tokens = sum(int(d.numel()) - 1 for d in docs)
    total = 0.0
    for d in docs:
        L = d.numel() - 1
        # [1, L] tokens/positions/labels -> per-token loss [1, L]
        causal = torch.ones(L, L, dtype=torch.bool).triu(1).view(1, 1, L, L)  # True = masked out
        loss = model(d[:-1].view(1, -1).long(), torch.arange(L).view(1, -1), causal,
                     labels=d[1:].view(1, -1).long())
        s = loss.sum()
        (s / total_tokens).backward()
        total += float(s.detach())
    params = [p for p in model.parameters() if p.requires_grad]
    norm = grad_norm(params)
    clip_(params, clip_grad, norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return {"loss": total / total_tokens, "grad_norm": norm}


def make_optimizer(params, lr: float, weight_decay: float = 0.01):
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)


def warmup_cosine(optimizer, warmup: int, total: int, min_ratio: float = 0.1):
    """LambdaLR: linear warmup over ``warmup`` steps, cosine decay to ``min_ratio`` at ``total``."""
    def f(step):
        if step < warmup:
            return (step + 1) / max(1, warmup)
        t = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, f)
