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
- a2a (Ulysses) rings, ulysses.py: ``qkv`` / ``dout`` carry this block's Q/K/V / dO of each other
  member's head group, ``out`` / ``dqkv`` each other member's block's output / dQ/dK/dV of this
  member's group; their Waits build this member's whole documents for its heads (``qkv``,
  ``dout``) or place the rows of its own block (``out``, ``dqkv``); their Compute attends the whole
  documents for its heads, forward or backward, with what the forward kept (``heads``).
- a2a+p2p rings, hier.py: ``hqkv`` / ``hout`` / ``hdout`` / ``hdqkv`` as a2a's inside each a2a
  group (to and from the group's super block), ``hkv`` / ``hdkv`` the zigzag ring of the groups;
  their Compute runs one ring step of the super blocks for this member's heads.
No autograd runs through communication. Every rank runs every instruction (proxies of routed
messages included): all ranks post the same exchanges in the same order.
"""

from __future__ import annotations

from typing import Dict

import torch

from megatron_zeppelin.distributed.executor import StepExchange
from megatron_zeppelin.planner.program import Compute, Post, Wait
from megatron_zeppelin.attention.blocks import attend, attend_backward, pack_kv
from megatron_zeppelin.attention.kernels import attend_pairs, attend_pairs_backward
from megatron_zeppelin.attention.ulysses import KINDS, A2ARing, Heads
from megatron_zeppelin.attention.hier import KINDS as HIER_KINDS, HierRing, hier_width
from megatron_zeppelin.spec.words import Comm, DocClass

TAGS = {"kv": 0, "dkv": 1, "gather": 2, "scatter": 3, "qkv": 4, "out": 5, "dout": 6, "dqkv": 7,
        **{k: 8 + n for n, k in enumerate(HIER_KINDS)}}  # exchanges a rank may keep in flight together


class LayerRun:
    """One pass of the program on this rank. ``grads``: (dout, dq, dk, dv) in the backward;
    ``heads``: per a2a ring id, what the forward kept (its ``heads`` after the run), for the backward."""

    def __init__(self, ctx, q, k, v, out, lse, local, grads=None, heads=None):
        self.ctx, self.q, self.k, self.v, self.out, self.lse, self.local = ctx, q, k, v, out, lse, local
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
        self.a2a = {rid: A2ARing(ctx.view, self.ring_of[rid], q.shape[1], k.shape[1], q.shape[2])
                    for rid in self.mine if self.ring_of[rid].comm == Comm.A2A}
        self.hier = {rid: HierRing(ctx.view, self.ring_of[rid], q.shape[1], k.shape[1], q.shape[2])
                     for rid in self.mine if self.ring_of[rid].comm == Comm.A2A_P2P}
        self.heads: Dict[int, Heads] = dict(heads or {})  # a2a and a2a+p2p rings: what the forward keeps
        self.dheads: Dict[int, torch.Tensor] = {}  # a2a backward: dO of this member's group
        self.dgrads: Dict[int, tuple] = {}  # a2a backward: dQ/dK/dV of this member's group

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
        a2a = [rid for rid in x.rings if rid in self.a2a]
        if a2a:
            self._compute_a2a(x, a2a)
        hier = [rid for rid in x.rings if rid in self.hier]
        if hier:
            with self.ctx.counters.timer(x.queue):
                for rid in hier:  # the ring of a2a groups, at its step (hier.py)
                    self.hier[rid].compute(x.steps[0], self.heads[rid], self.ctx.scale, self.ctx.backend,
                                           self.dheads[rid] if self.backward else None)
        if a2a or hier:
            if all(rid in self.a2a or rid in self.hier or rid not in self.mine for rid in x.rings):
                return
        with self.ctx.counters.timer(x.queue):
            work = []  # (ring id, block, its K/V message): every block of this Compute, one kernel call
            for rid in x.rings:
                if rid not in self.mine or rid in self.a2a or rid in self.hier:
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

    def _compute_a2a(self, x: Compute, rids) -> None:
        """Each a2a ring's whole documents for this member's heads: causal, one call per ring."""
        c = self.ctx
        with c.counters.timer(x.queue):
            for rid in rids:
                h, a = self.heads[rid], self.a2a[rid]
                if not self.backward:
                    attend_pairs(h.q, h.k, h.v, a.pairs, h.out, h.lse, c.scale, c.backend)
                    continue
                acc = h.out.dtype
                grads = tuple(torch.zeros(t.shape, dtype=acc, device=t.device) for t in (h.q, h.k, h.v))
                attend_pairs_backward(self.dheads[rid], h.q, h.k, h.v, h.out, h.lse, a.pairs, *grads, c.scale,
                                      c.backend)
                self.dgrads[rid] = grads

    def _payload_a2a(self, kind: str, rings) -> Dict[tuple, torch.Tensor]:
        pay: Dict[tuple, torch.Tensor] = {}
        for rid, a in self.a2a.items():
            if rid not in rings:
                continue
            if kind == "qkv":
                pay.update(a.send_qkv(self.q, self.k, self.v))
            elif kind == "out":
                pay.update(a.send_out(self.heads[rid], self.k.dtype))
            elif kind == "dout":
                pay.update(a.send_dout(self.dout))
            else:
                pay.update(a.send_dqkv(self.dgrads[rid], self.k.dtype))
        return pay

    def _wait_a2a(self, kind: str, rings, got) -> None:
        for rid, a in self.a2a.items():
            if rid not in rings:
                continue
            if kind == "qkv":
                self.heads[rid] = a.gather_qkv(got, self.q, self.k, self.v, self.out.dtype)
            elif kind == "out":
                a.place_out(got, self.heads[rid], self.out)
            elif kind == "dout":
                self.dheads[rid] = a.gather_dout(got, self.dout)
            else:
                a.place_dqkv(got, self.dgrads.pop(rid), self.dq, self.dk, self.dv)

    def _payload_hier(self, kind: str, step: int, rings) -> Dict[tuple, torch.Tensor]:
        pay: Dict[tuple, torch.Tensor] = {}
        for rid, h in self.hier.items():
            if rid not in rings:
                continue
            if kind == "hqkv":
                pay.update(h.send_qkv(self.q, self.k, self.v))
            elif kind == "hout":
                pay.update(h.send_out(self.heads[rid], self.k.dtype))
            elif kind == "hdout":
                pay.update(h.send_dout(self.dout))
            elif kind == "hdqkv":
                pay.update(h.send_dqkv(self.heads[rid], self.k.dtype))
            else:
                pay.update(h.send_ring(kind, step))
        return pay

    def _wait_hier(self, kind: str, step: int, rings, got) -> None:
        for rid, h in self.hier.items():
            if rid not in rings:
                continue
            if kind == "hqkv":
                self.heads[rid] = h.gather_qkv(got, self.q, self.k, self.v, self.out.dtype)
            elif kind == "hout":
                h.place_out(got, self.heads[rid], self.out)
            elif kind == "hdout":
                self.dheads[rid] = h.gather_dout(got, self.dout, self.heads[rid], self.dq.dtype)
            elif kind == "hdqkv":
                h.place_dqkv(got, self.dq, self.dk, self.dv)
            else:
                h.take_ring(kind, step, got)

    def post(self, x: Post) -> None:
        kind = x.name.split()[0]
        rings = set(x.rings)
        if kind in KINDS:
            self._start(x, kind, rings, self._payload_a2a(kind, rings), self._a2a_width(kind))
            return
        if kind in HIER_KINDS:
            hq, hk, d = self.q.shape[1], self.k.shape[1], self.q.shape[2]
            self._start(x, kind, rings, self._payload_hier(kind, x.step, rings),
                        lambda rid: hier_width(kind, self.ring_of[rid], hq, hk, d))
            return
        if kind == "kv":
            pay = {(rid, self._blk(rid, x.step)): self.held[rid] for rid in self.mine if rid in rings}
        elif kind == "dkv":
            pay = {(rid, self._blk(rid, x.step)): self.fresh[rid] for rid in self.mine
                   if rid in rings and rid in self.fresh}
        elif kind == "gather":
            pay = {(rid, self.mine[rid]): self.held[rid] for rid in self.mine if rid in rings}
        else:  # scatter: the others' blocks' partial dK/dV
            pay = {key: g for key, g in self.partial.items() if key[0] in rings and key[1] != self.mine[key[0]]}
        self._start(x, kind, rings, pay, self.width)

    def _a2a_width(self, kind: str):
        """Channels per row of an a2a exchange, per ring (rings of different sizes split differently)."""
        g = {r.id: r.size for r in self.ctx.rings}
        hq, hk, d = self.q.shape[1], self.k.shape[1], self.q.shape[2]
        per = (hq + 2 * hk) if kind in ("qkv", "dqkv") else hq
        return lambda rid: per // g[rid] * d

    def _start(self, x: Post, kind: str, rings, pay, width) -> None:
        c = self.ctx
        ex = StepExchange(c.step_ops(x.queue, x.step, rings), c.rank, c.group, pay, width, dtype=self.k.dtype,
                          device=self.k.device, reverse=x.reverse, counters=c.counters,
                          phase="bwd" if self.backward else "fwd", tag=TAGS[kind], tags=c.tags).start()
        self.ex[x.name] = (ex, x)

    def wait(self, x: Wait) -> None:
        ex, p = self.ex.pop(x.name)
        got = ex.wait()
        kind, s = p.name.split()[0], p.step
        if kind in KINDS:
            self._wait_a2a(kind, set(p.rings), got)
            return
        if kind in HIER_KINDS:
            self._wait_hier(kind, p.step, set(p.rings), got)
            return
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
