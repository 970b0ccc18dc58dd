"""The engine's interpreter of the layer program (planner/program.py): one layer's core attention
on this rank, forward or backward, with tensors.

The program fixes the order (queues, steps, overlap points, the pipelined dK/dV); this module says
what each instruction does with the rank's tensors:
- ``Compute``: this member's queries against the blocks it holds at those ring steps, every ring
  of the Compute in ONE kernel call (blocks.attend -> kernels.attend_blocks: one cu_seqlens set
  over all rings' blocks; zigzag: the block of member (i - s) mod G, which travelled here;
  all-gather: step 0 is the own block, the others come from the gather), or the local documents
  (one call too). Backward, each block's dK/dV share goes into a fresh buffer (a one-member ring's
  goes home at once).
- ``Post``: a StepExchange of the Plan's CommOps of (queue, step) of its rings, carrying: ``kv``
  the blocks held now; ``dkv`` the fresh dK/dV (plus what arrived from the predecessor);
  ``gather`` the own block to every member; ``scatter`` the partial dK/dV of the others' blocks
  home (mirrored ops).
- ``Wait``: ``kv``: the next block to hold; ``dkv``: the predecessor's partial, added to the fresh
  buffer, or, one step after a ring's last, the finished dK/dV of the own block (home);
  ``gather``: the others' blocks; ``scatter``: the partials of the own block, summed, home.
No autograd runs through communication. Every rank runs every instruction (proxies of routed
messages included): all ranks post the same exchanges in the same order.
"""

from __future__ import annotations

from typing import Dict

import torch

from megatron_zeppelin.distributed.executor import StepExchange
from megatron_zeppelin.planner.program import Compute, Post, Wait
from megatron_zeppelin.attention.blocks import attend, attend_backward, pack_kv
from megatron_zeppelin.spec.words import Comm, DocClass

TAGS = {"kv": 0, "dkv": 1, "gather": 2, "scatter": 3}  # exchanges a rank may keep in flight together


class LayerRun:
    """One pass of the program on this rank. ``grads``: (dout, dq, dk, dv) in the backward."""

    def __init__(self, ctx, q, k, v, out, lse, local, grads=None):
        self.ctx, self.q, self.k, self.out, self.lse, self.local = ctx, q, k, out, lse, local
        self.backward = grads is not None
        self.dout, self.dq, self.dk, self.dv = grads if grads is not None else (None,) * 4
        self.ring_of = {r.id: r for r in ctx.rings}
        self.mine = {r.id: ctx.view.member[r.id] for r in ctx.rings if r.id in ctx.view.member}
        self.width = 2 * k.shape[1] * k.shape[2]
        self.own = {rid: ctx.view.own_rows(self.ring_of[rid]) for rid in self.mine}
        self.held = {rid: pack_kv(k[o], v[o]) for rid, o in self.own.items()}  # zigzag: the block held now
        self.fresh: Dict[int, torch.Tensor] = {}  # zigzag backward: dK/dV of the block held now
        self.partial: Dict[tuple, torch.Tensor] = {}  # all-gather backward: (ring, block) -> dK/dV
        self.gathered: Dict[tuple, torch.Tensor] = {}
        self.ex: Dict[str, tuple] = {}  # name -> (exchange, its Post)

    def run(self, program) -> None:
        for x in program:
            if isinstance(x, Compute):
                self.compute(x)
            elif isinstance(x, Post):
                self.post(x)
            else:
                self.wait(x)

    # --- helpers -----------------------------------------------------------------------------
    def _blk(self, rid: int, s: int) -> int:
        return (self.mine[rid] - s) % self.ring_of[rid].size

    def _take(self, got, rid: int, b: int, sender: int):
        t = got.get((rid, b, sender))
        if t is None:
            if self.ctx.view.block_rows(self.ring_of[rid], b):
                raise RuntimeError(f"rank {self.ctx.rank}: block {b} of ring {rid} did not arrive")  # plan bug
            return self.k.new_zeros((0, self.width))
        return t

    def _home(self, rid: int, fin) -> None:  # this member's own block's finished dK/dV
        c, kh, d = self.width // 2, self.k.shape[1], self.k.shape[2]
        self.dk[self.own[rid]] += fin[:, :c].view(-1, kh, d)  # [rows, 2*kvh*d] -> [rows, kvh, d]
        self.dv[self.own[rid]] += fin[:, c:].view(-1, kh, d)

    # --- instructions ------------------------------------------------------------------------
    def compute(self, x: Compute) -> None:
        if x.queue == DocClass.LOCAL:
            self.local()
            return
        with self.ctx.counters.timer(x.queue):
            work = []  # (ring id, block, its K/V message): every block of this Compute, one kernel call
            for rid in x.rings:
                if rid not in self.mine:
                    continue
                r, i = self.ring_of[rid], self.mine[rid]
                for s in x.steps:
                    if s >= r.size:
                        continue
                    b = self._blk(rid, s)
                    if r.comm == Comm.P2P:
                        work.append((rid, b, self.held[rid]))
                    elif b == i or self.ctx.view.block_rows(r, b):
                        work.append((rid, b, self.held[rid] if b == i else self.gathered[(rid, b, r.ranks[b])]))
            c = self.ctx
            if not self.backward:
                attend(c.view, [(self.ring_of[rid], b, kv) for rid, b, kv in work], self.q, self.out, self.lse,
                       c.scale, c.backend)
                return
            grads = [torch.zeros_like(kv) for _, _, kv in work]  # each block's dK/dV share, fresh
            attend_backward(c.view, [(self.ring_of[rid], b, kv, g) for (rid, b, kv), g in zip(work, grads)],
                            self.q, self.out, self.lse, self.dout, self.dq, c.scale, c.backend)
            for (rid, b, _), g in zip(work, grads):
                if self.ring_of[rid].comm == Comm.P2P:
                    self.fresh[rid] = g
                    if self.ring_of[rid].size == 1:  # a one-member ring: nothing travels
                        self._home(rid, g)
                else:
                    self.partial[(rid, b)] = g

    def post(self, x: Post) -> None:
        kind = x.name.split()[0]
        rings = set(x.rings)
        if kind == "kv":
            pay = {(rid, self._blk(rid, x.step)): self.held[rid] for rid in self.mine if rid in rings}
        elif kind == "dkv":
            pay = {(rid, self._blk(rid, x.step)): self.fresh[rid] for rid in self.mine
                   if rid in rings and rid in self.fresh}
        elif kind == "gather":
            pay = {(rid, self.mine[rid]): self.held[rid] for rid in self.mine if rid in rings}
        else:  # scatter: the others' blocks' partial dK/dV
            pay = {key: g for key, g in self.partial.items() if key[0] in rings and key[1] != self.mine[key[0]]}
        c = self.ctx
        ex = StepExchange(c.step_ops(x.queue, x.step, rings), c.rank, c.group, pay, self.width, dtype=self.k.dtype,
                          device=self.k.device, reverse=x.reverse, counters=c.counters,
                          phase="bwd" if self.backward else "fwd", tag=TAGS[kind], tags=c.tags).start()
        self.ex[x.name] = (ex, x)

    def wait(self, x: Wait) -> None:
        ex, p = self.ex.pop(x.name)
        got = ex.wait()
        kind, s = p.name.split()[0], p.step
        for rid in self.mine:
            if rid not in p.rings:
                continue
            r, i = self.ring_of[rid], self.mine[rid]
            sender = r.ranks[(i - 1) % r.size]
            if kind == "kv":  # the block the predecessor held: the one to hold at step s + 1
                if s < r.size - 1:
                    self.held[rid] = self._take(got, rid, self._blk(rid, s + 1), sender)
            elif kind == "dkv":  # the predecessor's partial of the block held at step s + 1
                if r.size < 2:
                    continue
                part = self._take(got, rid, self._blk(rid, s + 1), sender)
                if s + 1 == r.size:  # the own block's, finished
                    self._home(rid, part)
                else:  # added, it travels on at step s + 1 (fresh is not read by any send yet)
                    self.fresh[rid] += part
            elif kind == "gather":
                self.gathered.update({k: t for k, t in got.items() if k[0] == rid})
            else:  # scatter: the own block's partials from every other member, summed
                tot = self.partial[(rid, i)]
                for j in range(r.size):
                    if j != i and (rid, i, r.ranks[j]) in got:
                        tot = tot + got[(rid, i, r.ranks[j])]
                self._home(rid, tot)
