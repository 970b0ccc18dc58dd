"""All-gather context parallelism (Ring.comm == "allgather", Llama-3 style) for one queue.

One exchange (the Plan's step-0 ops of the ring: every member's K/V block to every other member);
each member then attends its queries to all blocks. The backward gathers K/V again with the same
ops (nothing gathered is kept between forward and backward) and sends each block's partial dK/dV
home over the mirrored ops, where the owner sums them (a reduce-scatter through the schedule); the
own block is computed while those partials travel, and their wait is deferred to the next compute.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..distributed.executor import StepExchange
from .blocks import attend, attend_backward, pack_kv


def _rings(ctx, queue):
    return [r for r in ctx.rings if r.cls == queue and r.comm == "allgather"]


def _gather(ctx, queue, rings, mine, k, v, phase, tag):
    width = 2 * k.shape[1] * k.shape[2]
    pay = {(r.id, ctx.view.member[r.id]): pack_kv(k[ctx.view.own_rows(r)], v[ctx.view.own_rows(r)]) for r in mine}
    ex = StepExchange(ctx.step_ops(queue, 0, {r.id for r in rings}), ctx.rank, ctx.group, pay, width,
                      dtype=k.dtype, device=k.device, counters=ctx.counters, phase=phase, tag=tag).start()
    return pay, ex


def _blocks(ctx, r, pay, got, like, width):
    i = ctx.view.member[r.id]
    for b in range(r.size):
        if b == i:
            yield b, pay[(r.id, i)]
        elif ctx.view.block_rows(r, b):
            yield b, got[(r.id, b, r.ranks[b])]


def allgather_forward(ctx, queue: str, q, k, v, out, lse, overlap: Optional[Callable] = None):
    rings = _rings(ctx, queue)
    if not rings:
        return overlap
    mine = [r for r in rings if r.id in ctx.view.member]
    width = 2 * k.shape[1] * k.shape[2]
    pay, ex = _gather(ctx, queue, rings, mine, k, v, "fwd", 2)
    with ctx.counters.timer(queue):  # own block while the gather is in flight
        for r in mine:
            i = ctx.view.member[r.id]
            attend(ctx.view, r, i, pay[(r.id, i)], q, out, lse, ctx.scale, ctx.backend)
    if overlap is not None:
        overlap()
        overlap = None
    got = ex.wait()
    with ctx.counters.timer(queue):
        for r in mine:
            for b, kv in _blocks(ctx, r, pay, got, k, width):
                if b != ctx.view.member[r.id]:
                    attend(ctx.view, r, b, kv, q, out, lse, ctx.scale, ctx.backend)
    return overlap


def allgather_backward(ctx, queue: str, q, k, v, out, lse, dout, dq, dk, dv, overlap: Optional[Callable] = None):
    """Gather K/V (``overlap`` runs meanwhile); compute the other members' blocks first and send
    their partial dK/dV home, then compute the own block while that reduce-scatter is in flight.
    Its wait (and the sum) is returned as the new ``overlap``: it runs after the first compute of
    the next queue or ring kind (or at the end of the backward)."""
    rings = _rings(ctx, queue)
    if not rings:
        return overlap
    mine = [r for r in rings if r.id in ctx.view.member]
    width = 2 * k.shape[1] * k.shape[2]
    pay, ex = _gather(ctx, queue, rings, mine, k, v, "bwd", 2)
    if overlap is not None:
        overlap()
    got = ex.wait()
    partial = {}

    def part(r, b, kv):
        g = torch.zeros_like(kv)
        attend_backward(ctx.view, r, b, kv, g, q, out, lse, dout, dq, ctx.scale, ctx.backend)
        partial[(r.id, b)] = g

    with ctx.counters.timer(queue):
        for r in mine:
            for b, kv in _blocks(ctx, r, pay, got, k, width):
                if b != ctx.view.member[r.id]:
                    part(r, b, kv)
    # partial dK/dV of block b go home to member b over the mirrored step-0 ops
    ex = StepExchange(ctx.step_ops(queue, 0, {r.id for r in rings}), ctx.rank, ctx.group, partial, width,
                      dtype=k.dtype, device=k.device, reverse=True, counters=ctx.counters, phase="bwd",
                      tag=3).start()
    with ctx.counters.timer(queue):  # the own block while the partials travel
        for r in mine:
            i = ctx.view.member[r.id]
            part(r, i, pay[(r.id, i)])

    def finish():
        got = ex.wait()
        c = width // 2
        for r in mine:
            i = ctx.view.member[r.id]
            own = ctx.view.own_rows(r)
            tot = partial[(r.id, i)]
            for j in range(r.size):
                if j != i and (r.id, i, r.ranks[j]) in got:
                    tot = tot + got[(r.id, i, r.ranks[j])]
            dk[own] += tot[:, :c].view(-1, k.shape[1], k.shape[2])  # [rows, 2*kvh*d] -> [rows, kvh, d]
            dv[own] += tot[:, c:].view(-1, k.shape[1], k.shape[2])
    return finish
