"""Zigzag ring attention (Ring.comm == "p2p") for every ring of one queue, forward and backward.

Member i starts with its own K/V block i; ring step s moves block (i - s) mod G from member i to
member i+1 (the Plan's CommOps of (queue, s), executed by distributed.executor, so routed schedules
run unchanged). The forward computes G blocks with G-1 transfers, starting step s's transfer before
computing the block it holds (overlap). The backward carries each block's dK/dV accumulator with its
K/V: the K/V exchange of step s is started before computing, the dK/dV exchange after; step G-1
brings every block's finished dK/dV home. No autograd runs through communication.

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


def _rings(eng, queue):
    return [r for r in eng.plan.rings if r.cls == queue and r.comm == "p2p"]


def _take(eng, got, ring, b, width, like):
    i = eng.view.member[ring.id]
    t = got.get((ring.id, b, ring.ranks[(i - 1) % ring.size]))
    if t is None:
        if eng.view.block_rows(ring, b):
            raise RuntimeError(f"rank {eng.rank}: block {b} of ring {ring.id} did not arrive")  # plan bug
        return like.new_zeros((0, width))
    return t


def ring_forward(eng, queue: str, q, k, v, out, lse, overlap: Optional[Callable] = None):
    """Returns ``overlap`` if it was not run (no p2p ring in this queue)."""
    rings = _rings(eng, queue)
    if not rings:
        return overlap
    n = max(r.size for r in rings) - 1
    mine = [r for r in rings if r.id in eng.view.member]
    width = 2 * k.shape[1] * k.shape[2]
    cur = {r.id: pack_kv(k[eng.view.own_rows(r)], v[eng.view.own_rows(r)]) for r in mine}
    for s in range(n + 1):
        ex = None
        if s < n:
            active = {r.id for r in rings if s < r.size - 1}
            pay = {(r.id, (eng.view.member[r.id] - s) % r.size): cur[r.id] for r in mine if r.id in active}
            ex = StepExchange(eng.step_ops(queue, s, active), eng.rank, eng.group, pay, width, dtype=k.dtype,
                              device=k.device, counters=eng.counters, phase="fwd", tag=0).start()
        with eng.counters.timer(queue):
            for r in mine:
                if s < r.size:
                    attend(eng.view, r, (eng.view.member[r.id] - s) % r.size, cur[r.id], q, out, lse,
                           eng.scale, eng.backend)
        if overlap is not None:
            overlap()
            overlap = None
        if ex is not None:
            got = ex.wait()
            for r in mine:
                if s < r.size - 1:
                    cur[r.id] = _take(eng, got, r, (eng.view.member[r.id] - 1 - s) % r.size, width, k)
    return overlap


def ring_backward(eng, queue: str, q, k, v, out, lse, dout, dq, dk, dv, overlap: Optional[Callable] = None):
    rings = _rings(eng, queue)
    if not rings:
        return overlap
    n = max(r.size for r in rings)
    mine = [r for r in rings if r.id in eng.view.member]
    width = 2 * k.shape[1] * k.shape[2]
    own = {r.id: eng.view.own_rows(r) for r in mine}
    cur = {r.id: pack_kv(k[own[r.id]], v[own[r.id]]) for r in mine}
    dcur = {r.id: torch.zeros_like(cur[r.id]) for r in mine}
    for s in range(n):
        kv_active = {r.id for r in rings if s < r.size - 1}
        d_active = {r.id for r in rings if s < r.size}
        blk = {r.id: (eng.view.member[r.id] - s) % r.size for r in mine}
        ex_kv = None
        if kv_active:
            pay = {(rid, blk[rid]): cur[rid] for rid in blk if rid in kv_active}
            ex_kv = StepExchange(eng.step_ops(queue, s, kv_active), eng.rank, eng.group, pay, width,
                                 dtype=k.dtype, device=k.device, counters=eng.counters, phase="bwd", tag=0).start()
        with eng.counters.timer(queue):
            for r in mine:
                if s < r.size:
                    attend_backward(eng.view, r, blk[r.id], cur[r.id], dcur[r.id], q, out, lse, dout, dq,
                                    eng.scale, eng.backend)
        if overlap is not None:
            overlap()
            overlap = None
        pay = {(rid, blk[rid]): dcur[rid] for rid in blk if rid in d_active}
        ex_d = StepExchange(eng.step_ops(queue, s, d_active), eng.rank, eng.group, pay, width, dtype=k.dtype,
                            device=k.device, counters=eng.counters, phase="bwd", tag=1).start()
        got = ex_kv.wait() if ex_kv is not None else {}
        got_d = ex_d.wait()
        for r in mine:
            nb = (eng.view.member[r.id] - 1 - s) % r.size
            if s < r.size - 1:
                cur[r.id] = _take(eng, got, r, nb, width, k)
                dcur[r.id] = _take(eng, got_d, r, nb, width, k).clone()
            elif s == r.size - 1:  # nb is this member's own block: its finished dK/dV came home
                fin = dcur[r.id] if r.size == 1 else _take(eng, got_d, r, nb, width, k)
                c = width // 2
                dk[own[r.id]] += fin[:, :c].view(-1, k.shape[1], k.shape[2])
                dv[own[r.id]] += fin[:, c:].view(-1, k.shape[1], k.shape[2])
    return overlap
