"""What an a2a+p2p (hierarchical CP) ring's exchanges carry and what a member does with what arrives.

As Transformer Engine's ``cp_comm_type="a2a+p2p"`` runs it (transformer_engine/pytorch/attention/
dot_product_attention/context_parallel.py, AttnFuncWithCPAndKVP2P with ``cp_group = [a2a group,
p2p group]``; the THD form landed in TE's release_v2.19, PR #3290), with the groups Megatron-LM's
``--hierarchical-context-parallel-sizes a p`` makes (megatron/core/parallel_state.py
create_hierarchical_groups: level 0 = blocks of ``a`` consecutive CP ranks, level 1 = ranks ``a``
apart). Member m = P*a + j of a ring of a*p holds its zigzag block (chunks m and 2ap-1-m of each
ring document) with every head; head group j is Q heads [j*H/a, (j+1)*H/a) and K/V heads
[j*Hkv/a, (j+1)*Hkv/a). The program (planner/program.py ``hier_section``) posts:

- ``hqkv`` (step p): member (P, j) sends member (P, j') its block's Q/K/V of group j'. Member (P, j)
  then holds group j's *super block* P: chunks [P*a, (P+1)*a) and their mirrors of every ring
  document, in order, which is TE's reorder after its all-to-all (thd_cp_rank_order_to_sequence_order
  over the a2a group): the zigzag block P of a ring of p over the document's super chunks;
- ``hkv`` / ``hdkv`` (steps 0..p-1): the zigzag ring of the p groups, one per head group: member
  (P, j) passes the super block's K/V (dK/dV in the backward) it holds to member (P + 1, j), as a
  p2p ring does (runner.py) with the group's share of the K/V heads;
- ``hout`` (step p + 1): member (P, j) sends member (P, j') the output rows of j''s block for group j;
- ``hdout`` / ``hdqkv``: the backward's mirrors (dO in, dQ/dK/dV home).

As TE saves its post-all-to-all Q/K/V, output and log-sum-exp for the backward, a member keeps its
group's super block from the forward (ulysses.Heads: the engine saves it with the layer's autograd
context). The ring part reuses the zigzag block compute (blocks.py) through a RankView of the super
blocks (``self.view``, ``self.ring``: a ring of p members over documents cut at super bounds).
"""

from __future__ import annotations

from typing import Dict, List

import torch

from megatron_zeppelin.planner.program import hier_p2p_size, super_bounds
from megatron_zeppelin.planner.types import DocPlan, PlanError, Ring, Segment
from megatron_zeppelin.attention.blocks import attend, attend_backward, pack_kv, unpack_kv
from megatron_zeppelin.attention.ulysses import Heads
from megatron_zeppelin.attention.view import RankView

KINDS = ("hqkv", "hkv", "hdkv", "hout", "hdout", "hdqkv")  # the Post names of a2a+p2p exchanges


def hier_width(kind: str, ring: Ring, heads: int, kv_heads: int, d: int) -> int:
    """Channels per message row of ``kind`` on ``ring``: one head group's Q|K|V (hqkv, hdqkv), its
    output (hout, hdout) or its K|V (hkv, hdkv)."""
    a = ring.a2a
    hq, hk = heads // a, kv_heads // a
    return {"hqkv": hq + 2 * hk, "hdqkv": hq + 2 * hk, "hout": hq, "hdout": hq}.get(kind, 2 * hk) * d


class HierRing:
    """This rank's part of one a2a+p2p ring: its group's rows in the super block, its head group,
    the ring of groups as a RankView, and the payloads of every exchange."""

    def __init__(self, view: RankView, ring: Ring, heads: int, kv_heads: int, d: int):
        try:
            p = hier_p2p_size(ring)
        except ValueError as e:
            raise PlanError(str(e)) from None
        a = ring.a2a
        if heads % a or kv_heads % a:
            raise PlanError(f"a2a+p2p ring {ring.id}: its a2a groups of {a} cannot split {heads} Q / {kv_heads} "
                            "K/V heads (TE needs both divisible by the a2a group size)")
        self.ring, self.a, self.p, self.d = ring, a, p, d
        self.m = view.member[ring.id]
        self.P, self.j = divmod(self.m, a)
        self.hq, self.hk = heads // a, kv_heads // a
        # The ring of groups: p virtual members over the super chunks; this rank is member P of it.
        sdocs = {x: DocPlan(x, view.docs[x].length, view.docs[x].cls, ring.id, -1,
                            super_bounds(view.docs[x].bounds, a)) for x in ring.docs}
        self.sring = Ring(ring.id, tuple(range(p)), ring.cls, ring.docs)
        offset, row = {}, 0
        for x in ring.docs:
            for s in sdocs[x].member_segments(self.P):
                offset[s] = row
                row += len(s)
        self.tokens = row  # rows of super block P
        self.view = RankView(self.P, row, offset, {ring.id: self.P}, sdocs, ())
        # the rows of each member of group P's block (block order) in the super block
        supers = [s for x in ring.docs for s in sdocs[x].member_segments(self.P)]
        self.rows: List[torch.Tensor] = []
        for jj in range(a):
            idx = []
            for s, _ in view.block(ring, self.P * a + jj):
                sup = next(u for u in supers if u.doc == s.doc and u.start <= s.start and s.stop <= u.stop)
                first = offset[sup] + s.start - sup.start
                idx.extend(range(first, first + len(s)))
            self.rows.append(torch.tensor(idx, dtype=torch.long))
        self.own = torch.tensor(view.own_rows(ring), dtype=torch.long)  # this rank's block in its tensors
        self.held = None  # the super block's K/V (or its dK/dV share) held at this ring step
        self.fresh = None
        self.dhome = None  # backward: dK/dV of the own super block, home
        self.dq = None

    # --- helpers -------------------------------------------------------------------------------
    def _rank(self, jj: int) -> int:
        return self.ring.ranks[self.P * self.a + jj]

    def _q(self, jj: int) -> slice:
        return slice(jj * self.hq, (jj + 1) * self.hq)

    def _kv(self, jj: int) -> slice:
        return slice(jj * self.hk, (jj + 1) * self.hk)

    def _flat(self, *parts: torch.Tensor) -> torch.Tensor:
        return torch.cat([x.reshape(x.shape[0], -1) for x in parts], dim=1)

    def _split(self, msg: torch.Tensor):
        n, qa, kb = msg.shape[0], self.hq * self.d, self.hk * self.d
        return (msg[:, :qa].view(n, self.hq, self.d), msg[:, qa:qa + kb].view(n, self.hk, self.d),
                msg[:, qa + kb:].view(n, self.hk, self.d))

    def _got(self, got, block: int, sender: int, rows: int, width: int, like: torch.Tensor) -> torch.Tensor:
        t = got.get((self.ring.id, block, sender))
        if t is None:
            if rows:  # a plan bug: the schedule sends every nonempty block
                raise RuntimeError(f"a2a+p2p ring {self.ring.id}: block {block} from rank {sender} did not arrive")
            return like.new_zeros((0, width))
        return t

    def _sblock(self, s: int) -> int:
        """The super block (group) whose K/V this member holds at ring step ``s``."""
        return (self.P - s) % self.p

    def _srows(self, group: int) -> int:
        return self.view.block_rows(self.sring, group)

    # --- all-to-all inside the group -----------------------------------------------------------
    def send_qkv(self, q, k, v) -> Dict[tuple, torch.Tensor]:
        o, rid = self.own, self.ring.id
        return {(rid, self.m, self._rank(jj)): self._flat(q[o][:, self._q(jj)], k[o][:, self._kv(jj)],
                                                         v[o][:, self._kv(jj)])
                for jj in range(self.a) if jj != self.j}

    def gather_qkv(self, got, q, k, v, acc) -> Heads:
        """Group j's super block P: Q/K/V rows from every member of the group; output and
        log-sum-exp accumulators (dtype ``acc``) empty. Holds its K/V for ring step 0."""
        n, j, o = self.tokens, self.j, self.own
        hq = q.new_zeros((n, self.hq, self.d))
        hk, hv = k.new_zeros((n, self.hk, self.d)), v.new_zeros((n, self.hk, self.d))
        r = self.rows[j]
        hq[r], hk[r], hv[r] = q[o][:, self._q(j)], k[o][:, self._kv(j)], v[o][:, self._kv(j)]
        width = (self.hq + 2 * self.hk) * self.d
        for jj in range(self.a):
            if jj != j and len(self.rows[jj]):
                msg = self._got(got, self.P * self.a + jj, self._rank(jj), len(self.rows[jj]), width, q)
                hq[self.rows[jj]], hk[self.rows[jj]], hv[self.rows[jj]] = self._split(msg)
        self.held = pack_kv(hk, hv)
        out = torch.zeros((n, self.hq, self.d), dtype=acc, device=q.device)
        lse = torch.full((n, self.hq), float("-inf"), dtype=acc, device=q.device)
        return Heads(hq, hk, hv, out, lse)

    def send_out(self, h: Heads, dtype) -> Dict[tuple, torch.Tensor]:
        rid = self.ring.id
        return {(rid, self.P * self.a + jj, self._rank(jj)): self._flat(h.out[self.rows[jj]].to(dtype))
                for jj in range(self.a) if jj != self.j}

    def place_out(self, got, h: Heads, out) -> None:
        o = self.own
        out[o, self._q(self.j)] = h.out[self.rows[self.j]]
        for jj in range(self.a):
            if jj != self.j and len(o):
                msg = self._got(got, self.m, self._rank(jj), len(o), self.hq * self.d, out)
                out[o, self._q(jj)] = msg.view(len(o), self.hq, self.d).to(out.dtype)

    def send_dout(self, dout) -> Dict[tuple, torch.Tensor]:
        o, rid = self.own, self.ring.id
        return {(rid, self.m, self._rank(jj)): self._flat(dout[o][:, self._q(jj)])
                for jj in range(self.a) if jj != self.j}

    def gather_dout(self, got, dout, h: Heads, acc) -> torch.Tensor:
        """dO of group j's super block; the backward's ring then starts from its own K/V."""
        hd = dout.new_zeros((self.tokens, self.hq, self.d))
        hd[self.rows[self.j]] = dout[self.own][:, self._q(self.j)]
        for jj in range(self.a):
            if jj != self.j and len(self.rows[jj]):
                msg = self._got(got, self.P * self.a + jj, self._rank(jj), len(self.rows[jj]), self.hq * self.d, dout)
                hd[self.rows[jj]] = msg.view(-1, self.hq, self.d)
        self.held = pack_kv(h.k, h.v)
        self.dq = torch.zeros(h.q.shape, dtype=acc, device=h.q.device)
        return hd

    def send_dqkv(self, h: Heads, dtype) -> Dict[tuple, torch.Tensor]:
        dk, dv = unpack_kv(self.dhome, self.hk, self.d)
        rid = self.ring.id
        return {(rid, self.P * self.a + jj, self._rank(jj)): self._flat(*(x[self.rows[jj]].to(dtype)
                                                                         for x in (self.dq, dk, dv)))
                for jj in range(self.a) if jj != self.j}

    def place_dqkv(self, got, dq, dk, dv) -> None:
        o, j = self.own, self.j
        hdk, hdv = unpack_kv(self.dhome, self.hk, self.d)
        for x, t, sl in zip((self.dq, hdk, hdv), (dq, dk, dv), (self._q(j), self._kv(j), self._kv(j))):
            t[o, sl] += x[self.rows[j]].to(t.dtype)
        for jj in range(self.a):
            if jj != j and len(o):
                msg = self._got(got, self.m, self._rank(jj), len(o), (self.hq + 2 * self.hk) * self.d, dq)
                for x, t, sl in zip(self._split(msg), (dq, dk, dv), (self._q(jj), self._kv(jj), self._kv(jj))):
                    t[o, sl] += x.to(t.dtype)
        self.dq = self.dhome = None

    # --- the ring of groups --------------------------------------------------------------------
    def compute(self, s: int, h: Heads, scale: float, backend, dheads=None) -> None:
        """Ring step ``s``: group j's queries of super block P against the super block held."""
        item = (self.sring, self._sblock(s), self.held)
        if dheads is None:
            attend(self.view, [item], h.q, h.out, h.lse, scale, backend)
            return
        self.fresh = torch.zeros_like(self.held)
        attend_backward(self.view, [item + (self.fresh,)], h.q, h.out, h.lse, dheads, self.dq, scale, backend)

    def send_ring(self, kind: str, s: int) -> Dict[tuple, torch.Tensor]:
        """Step ``s`` of the ring: the K/V held (hkv) or its dK/dV so far (hdkv), to member (P + 1, j)."""
        return {(self.ring.id, self._sblock(s) * self.a + self.j): self.held if kind == "hkv" else self.fresh}

    def take_ring(self, kind: str, s: int, got) -> None:
        """What member (P - 1, j) passed at step ``s``: the K/V to hold at step s + 1, or the partial
        dK/dV of the super block held at step s + 1 (the own one, finished, after the last step)."""
        nxt = self._sblock(s + 1)
        sender = self.ring.ranks[((self.P - 1) % self.p) * self.a + self.j]
        part = self._got(got, nxt * self.a + self.j, sender, self._srows(nxt), 2 * self.hk * self.d, self.held)
        if kind == "hkv":
            self.held = part
        elif s + 1 == self.p:
            self.dhome = part
        else:
            self.fresh = self.fresh + part
