"""The remap layer: hidden states between the attention layout and the linear layout.

``remap_to_linear(x, plan, rank, group)``: ``x`` is ``[t_att, *]`` (this rank's rows in
attention-layout order, ``t_att = plan.tokens(rank)``), the result ``[t_lin, *]`` in linear-layout
order. ``remap_to_attention`` is its exact inverse. Both are differentiable; the backward of each is
the other's exchange (all_to_all_v mirrors itself, and slicing/concatenation route gradients back
to the rows they came from). Only rows move: the values are copied bit for bit, any dtype.
No communication when ``plan.remap`` is empty (then the two layouts are the same).
Like every autograd collective, the backward must run on every rank of the group (the loss of
every rank must depend on the output), or the ranks that do run it wait for the others.

``group``: the domain process group whose group ranks 0..W-1 are the plan's ranks. ``counters``
(distributed/counters.py CommCounters): bytes this rank sends, per link class and NIC, under the
step keys ("remap", "fwd" | "bwd", 0 for to-linear | 1 for to-attention).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from megatron_zeppelin.distributed.all_to_all import all_to_all_v
from megatron_zeppelin.remapping.index import RemapIndex, RemapLayoutError, build_index
from megatron_zeppelin.spec.words import Link

def remap_index(plan, rank: int, direction: str) -> RemapIndex:
    """The row bookkeeping of ``rank`` for ``plan``, built once and kept with the plan."""
    return plan.derived(("remap_index", rank, direction), lambda: build_index(
        plan.attention_layout, plan.linear_layout, plan.remap, rank, direction))


def _rows(t: torch.Tensor, runs) -> torch.Tensor:
    if len(runs) == 1:
        a, b = runs[0]
        return t[a:b]
    if not runs:
        return t[:0]
    return torch.cat([t[a:b] for a, b in runs])


def _check(x: torch.Tensor, plan, rank: int, group, layout: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise RemapLayoutError("remap takes hidden states [tokens, *] (at least 1-D)")
    if not 0 <= rank < plan.world_size:
        raise RemapLayoutError(f"rank {rank} is outside the plan's {plan.world_size} ranks")
    want = plan.tokens(rank, layout)
    if x.shape[0] != want:
        raise RemapLayoutError(f"rank {rank}: hidden states have {x.shape[0]} rows but the plan's {layout} "
                               f"layout holds {want} tokens (is this the plan of this micro-batch?)")
    if plan.remap and dist.is_initialized():
        world, me = dist.get_world_size(group), dist.get_rank(group)
        if world != plan.world_size or me != rank:
            raise RemapLayoutError(f"remap group has {world} ranks (this is group rank {me}) but the plan "
                                   f"has {plan.world_size} and was given rank {rank}: pass the domain group")


def _counter(counters, plan, rank: int, direction: str):
    """on_send callback: bytes this rank sends, per link class and NIC, keyed ("remap", fwd|bwd, 0|1)."""
    if counters is None:
        return None
    topo = plan.topology

    def on_send(rows, row_bytes, phase):
        for peer, n in enumerate(rows):
            if n and peer != rank:
                nic = -1 if topo.same_node(rank, peer) else topo.nic_of(rank)
                counters.add_bytes(Link.NVLINK if nic < 0 else Link.NIC, nic, n * row_bytes,
                                   ("remap", phase, int(direction == "to_attention")), rows=n)
    return on_send


def _remap(x: torch.Tensor, plan, rank: int, group, direction: str, method: str, counters) -> torch.Tensor:
    ix = remap_index(plan, rank, direction)
    send = _rows(x, ix.send_runs)  # [sum(send_counts), *] rows for group rank 0, then 1, ...
    recv = all_to_all_v(send, ix.send_counts, ix.recv_counts, group, method=method,
                        on_send=_counter(counters, plan, rank, direction))  # [sum(recv), *]
    # Even an empty ``recv`` joins the pool: its backward must run on every rank, because it sends
    # the gradients of this rank's sent rows home (skipping it would leave the peers waiting).
    pool = torch.cat([x, recv])  # [n_in + sum(recv), *]
    return _rows(pool, ix.out_runs)  # [n_out, *] in destination-layout order


def remap_to_linear(x: torch.Tensor, plan, rank: int, group: Optional[dist.ProcessGroup] = None, *,
                    method: str = "p2p", counters=None) -> torch.Tensor:
    """[t_att, *] attention layout -> [t_lin, *] linear layout (forward ``plan.remap`` moves)."""
    _check(x, plan, rank, group, "attention")
    if not plan.remap:
        return x
    return _remap(x, plan, rank, group, "to_linear", method, counters)


def remap_to_attention(y: torch.Tensor, plan, rank: int, group: Optional[dist.ProcessGroup] = None, *,
                       method: str = "p2p", counters=None) -> torch.Tensor:
    """[t_lin, *] linear layout -> [t_att, *] attention layout (the moves reversed)."""
    _check(y, plan, rank, group, "linear")
    if not plan.remap:
        return y
    return _remap(y, plan, rank, group, "to_attention", method, counters)
