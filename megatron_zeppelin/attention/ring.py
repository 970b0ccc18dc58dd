"""Zigzag ring attention (Ring.comm == "p2p") for every ring of one queue, forward and backward.

Member i starts with its own K/V block i; ring step s moves block (i - s) mod G from member i to
member i+1 (the Plan's CommOps of (queue, s), executed by distributed.executor, so routed schedules
run unchanged). The forward computes G blocks with G-1 transfers, starting step s's transfer before
computing the block it holds (overlap). The backward carries each block's dK/dV accumulator with its
K/V, pipelined: step s starts the K/V exchange, computes this member's share of the block it holds
while the K/V and the dK/dV partial sent at step s-1 are in flight, then adds that partial and
sends the sum on (step s's ops); step G-1's dK/dV comes home during the next queue's first compute.
No autograd runs through communication.

All rings of a queue step together (global step s = step s of each ring; a ring of G members is
active in steps < G-1 forward, <= G-1 backward). Every rank runs every step of the queue, member or
not, because routed messages may pass through it (proxies); ops come from the Plan, so all ranks
post the same exchanges in the same order.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..distributed.executor import StepExchange
from .blocks import attend, attend_backward, pack_kv


def _rings(ctx, queue):
    return [r for r in ctx.rings if r.cls == queue and r.comm == "p2p"]


def _take(ctx, got, ring, b, width, like):
    i = ctx.view.member[ring.id]
    t = got.get((ring.id, b, ring.ranks[(i - 1) % ring.size]))
    if t is None:
        if ctx.view.block_rows(ring, b):
            raise RuntimeError(f"rank {ctx.rank}: block {b} of ring {ring.id} did not arrive")  # plan bug
        return like.new_zeros((0, width))
    return t


def ring_forward(ctx, queue: str, q, k, v, out, lse, overlap: Optional[Callable] = None):
    """Returns ``overlap`` if it was not run (no p2p ring in this queue)."""
    rings = _rings(ctx, queue)
    if not rings:
        return overlap
    n = max(r.size for r in rings) - 1
    mine = [r for r in rings if r.id in ctx.view.member]
    width = 2 * k.shape[1] * k.shape[2]
    cur = {r.id: pack_kv(k[ctx.view.own_rows(r)], v[ctx.view.own_rows(r)]) for r in mine}
    for s in range(n + 1):
        ex = None
        if s < n:
            active = {r.id for r in rings if s < r.size - 1}
            pay = {(r.id, (ctx.view.member[r.id] - s) % r.size): cur[r.id] for r in mine if r.id in active}
            ex = StepExchange(ctx.step_ops(queue, s, active), ctx.rank, ctx.group, pay, width, dtype=k.dtype,
                              device=k.device, counters=ctx.counters, phase="fwd", tag=0).start()
        with ctx.counters.timer(queue):
            for r in mine:
                if s < r.size:
                    attend(ctx.view, r, (ctx.view.member[r.id] - s) % r.size, cur[r.id], q, out, lse,
                           ctx.scale, ctx.backend)
        if overlap is not None:
            overlap()
            overlap = None
        if ex is not None:
            got = ex.wait()
            for r in mine:
                if s < r.size - 1:
                    cur[r.id] = _take(ctx, got, r, (ctx.view.member[r.id] - 1 - s) % r.size, width, k)
    return overlap


def ring_backward(ctx, queue: str, q, k, v, out, lse, dout, dq, dk, dv, overlap: Optional[Callable] = None):
    """Pipelined as ring-flash-attention: at step s a member computes its share of the block it now
    holds into a fresh buffer while the dK/dV partial it will add (sent by its predecessor at step
    s-1) is in flight; then it waits, adds, and starts sending the sum (step s's ops). Step G-1's
    dK/dV comes home at "step G": that last wait is returned as the new ``overlap`` callable, so it
    runs after the first compute of the next queue (or at the end of the engine's backward).
    Exchanges in flight together: K/V of step s (tag 0) and dK/dV of step s-1 (tag 1), then K/V of
    s and dK/dV of s; two dK/dV exchanges never overlap on a rank (one is waited before the next
    starts), and every rank posts and waits them in the same order, so they cannot deadlock."""
    rings = _rings(ctx, queue)
    if not rings:
        return overlap
    n = max(r.size for r in rings)
    mine = [r for r in rings if r.id in ctx.view.member]
    width = 2 * k.shape[1] * k.shape[2]
    own = {r.id: ctx.view.own_rows(r) for r in mine}
    cur = {r.id: pack_kv(k[own[r.id]], v[own[r.id]]) for r in mine}
    c = width // 2

    def home(r, fin):  # this member's own block's finished dK/dV
        dk[own[r.id]] += fin[:, :c].view(-1, k.shape[1], k.shape[2])  # [rows, 2*kvh*d] -> [rows, kvh, d]
        dv[own[r.id]] += fin[:, c:].view(-1, k.shape[1], k.shape[2])

    def arrived(ex_d, s):
        """Wait for the dK/dV exchange of step s-1: per ring id, the partial of the block held at s."""
        if ex_d is None:
            return {}
        got = ex_d.wait()
        return {r.id: _take(ctx, got, r, (ctx.view.member[r.id] - s) % r.size, width, k)
                for r in mine if 1 < r.size and s <= r.size}

    ex_d = None
    for s in range(n):
        kv_active = {r.id for r in rings if s < r.size - 1}
        d_active = {r.id for r in rings if s < r.size}
        blk = {r.id: (ctx.view.member[r.id] - s) % r.size for r in mine}
        ex_kv = None
        if kv_active:
            pay = {(rid, blk[rid]): cur[rid] for rid in blk if rid in kv_active}
            ex_kv = StepExchange(ctx.step_ops(queue, s, kv_active), ctx.rank, ctx.group, pay, width,
                                 dtype=k.dtype, device=k.device, counters=ctx.counters, phase="bwd", tag=0).start()
        fresh = {}
        with ctx.counters.timer(queue):  # overlaps K/V of step s and dK/dV of step s-1
            for r in mine:
                if s < r.size:
                    fresh[r.id] = torch.zeros_like(cur[r.id])
                    attend_backward(ctx.view, r, blk[r.id], cur[r.id], fresh[r.id], q, out, lse, dout, dq,
                                    ctx.scale, ctx.backend)
        if overlap is not None:
            overlap()
            overlap = None
        part = arrived(ex_d, s)
        for r in mine:
            if s == r.size and r.id in part:  # a shorter ring's own block came home last step
                home(r, part[r.id])
            elif r.id in fresh and r.id in part and s > 0:
                fresh[r.id] += part[r.id]  # the sum travels on (fresh is not read by any send yet)
            if r.size == 1 and s == 0:
                home(r, fresh[r.id])  # a one-member ring: nothing travels
        pay = {(rid, blk[rid]): fresh[rid] for rid in blk if rid in d_active and rid in fresh}
        ex_d = StepExchange(ctx.step_ops(queue, s, d_active), ctx.rank, ctx.group, pay, width, dtype=k.dtype,
                            device=k.device, counters=ctx.counters, phase="bwd", tag=1).start()
        got = ex_kv.wait() if ex_kv is not None else {}
        for r in mine:
            if s < r.size - 1:
                cur[r.id] = _take(ctx, got, r, (ctx.view.member[r.id] - 1 - s) % r.size, width, k)

    def finish(ex_d=ex_d):  # step G-1's dK/dV of the longest rings comes home
        part = arrived(ex_d, n)
        for r in mine:
            if r.size == n and r.id in part:
                home(r, part[r.id])
    return finish
