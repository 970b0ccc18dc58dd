"""What an a2a (DeepSpeed-Ulysses) ring's exchanges carry and what a member does with what arrives.

As Transformer Engine's ``cp_comm_type="a2a"`` runs it (transformer_engine/pytorch/attention/
dot_product_attention/context_parallel.py, AttnFuncWithCPAndQKVOA2A with flash_attn_a2a_communicate):
member i of a ring of G holds its zigzag block (chunks i and 2G-1-i of each ring document) with
every head; head group j is Q heads [j*H/G, (j+1)*H/G) and K/V heads [j*Hkv/G, (j+1)*Hkv/G)
(contiguous: GQA's query-to-key head map stays inside a group). The program (planner/program.py)
posts:

- ``qkv`` (step 0): member i sends member j its block's Q/K/V of group j; member j then holds
  every document whole for its group (rows placed by their positions in the document);
- ``out`` (step 1): member j sends member i the output rows of i's block for group j;
- ``dout`` (step 1 mirrored): member i sends member j its block's dO of group j;
- ``dqkv`` (step 0 mirrored): member j sends member i the dQ/dK/dV of i's block for group j.

As TE saves its head-sharded Q/K/V, output and log-sum-exp for the backward (no exchange of them
there), a member keeps its group's whole-document tensors from the forward (``Heads``): the engine
saves them with the layer's autograd context. A message row is one token of the block, its
channels one head group's Q|K|V (step 0) or output (step 1), flattened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch

from megatron_zeppelin.planner.types import PlanError, Ring
from megatron_zeppelin.attention.view import RankView

KINDS = ("qkv", "out", "dout", "dqkv")  # the Post names of a2a exchanges (program.py)


@dataclass
class Heads:
    """One member's head group of an a2a ring, every ring document whole (documents in ring order,
    each at ``base``): Q/K/V from the forward's all-to-all, its output and log-sum-exp."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor

    def tensors(self) -> Tuple[torch.Tensor, ...]:
        return self.q, self.k, self.v, self.out, self.lse


class A2ARing:
    """This rank's view of one a2a ring: the rows of each member's block in the whole-document
    tensors, its head groups, and the payloads of the four exchanges."""

    def __init__(self, view: RankView, ring: Ring, heads: int, kv_heads: int, d: int):
        g = ring.size
        if heads % g or kv_heads % g:
            raise PlanError(f"a2a ring {ring.id} of {g} members cannot split {heads} Q / {kv_heads} K/V heads "
                            "(Ulysses needs both divisible by the CP size)")
        self.ring, self.g, self.i, self.d = ring, g, view.member[ring.id], d
        self.hq, self.hk = heads // g, kv_heads // g
        base, at = {}, 0
        for doc in ring.docs:
            base[doc] = at
            at += view.docs[doc].length
        self.tokens = at
        self.pairs = [(slice(base[x], base[x] + view.docs[x].length),) * 2 + (0,) for x in ring.docs
                      if view.docs[x].length]
        # block b's rows, in block (message) order, as positions in the whole-document tensors
        self.rows: List[torch.Tensor] = [
            torch.tensor([base[s.doc] + p for s, _ in view.block(ring, b) for p in range(s.start, s.stop)],
                         dtype=torch.long) for b in range(g)]
        self.own = torch.tensor(view.own_rows(ring), dtype=torch.long)  # this rank's block in its tensors

    def _q(self, j: int) -> slice:
        return slice(j * self.hq, (j + 1) * self.hq)

    def _kv(self, j: int) -> slice:
        return slice(j * self.hk, (j + 1) * self.hk)

    def _flat(self, *parts: torch.Tensor) -> torch.Tensor:
        # flatten(1), not reshape(n, -1): a member holding no token (a document shorter than the
        # ring's 2 x G chunks) sends a [0, heads, d] block, whose -1 reshape is ambiguous
        return torch.cat([p.flatten(1) for p in parts], dim=1)

    def _split(self, msg: torch.Tensor):
        n, a, b = msg.shape[0], self.hq * self.d, self.hk * self.d
        return (msg[:, :a].view(n, self.hq, self.d), msg[:, a:a + b].view(n, self.hk, self.d),
                msg[:, a + b:].view(n, self.hk, self.d))

    # --- forward -------------------------------------------------------------------------------
    def send_qkv(self, q, k, v) -> Dict[tuple, torch.Tensor]:
        """Step 0: this block's Q/K/V of group j, to member j (every j but this member)."""
        o, rid = self.own, self.ring.id
        return {(rid, self.i, self.ring.ranks[j]): self._flat(q[o][:, self._q(j)], k[o][:, self._kv(j)],
                                                             v[o][:, self._kv(j)])
                for j in range(self.g) if j != self.i}

    def gather_qkv(self, got, q, k, v, acc) -> Heads:
        """The whole documents of this member's group: its own block's rows, and each other
        member's block as it arrived; output and log-sum-exp accumulators (dtype ``acc``) empty."""
        i, n = self.i, self.tokens
        hq = q.new_zeros((n, self.hq, self.d))
        hk, hv = k.new_zeros((n, self.hk, self.d)), v.new_zeros((n, self.hk, self.d))
        o = self.own
        hq[self.rows[i]], hk[self.rows[i]], hv[self.rows[i]] = q[o][:, self._q(i)], k[o][:, self._kv(i)], \
            v[o][:, self._kv(i)]
        for b in range(self.g):
            if b != i and len(self.rows[b]):
                hq[self.rows[b]], hk[self.rows[b]], hv[self.rows[b]] = self._split(self._got(got, b, b))
        out = torch.zeros((n, self.hq, self.d), dtype=acc, device=q.device)
        lse = torch.full((n, self.hq), float("-inf"), dtype=acc, device=q.device)
        return Heads(hq, hk, hv, out, lse)

    def send_out(self, h: Heads, dtype) -> Dict[tuple, torch.Tensor]:
        """Step 1: the output rows of member b's block for this group, to member b."""
        rid = self.ring.id
        return {(rid, b, self.ring.ranks[b]): self._flat(h.out[self.rows[b]].to(dtype))
                for b in range(self.g) if b != self.i}

    def place_out(self, got, h: Heads, out) -> None:
        """This block's output: its own group's rows, and group j's as member j sent them."""
        o = self.own
        out[o, self._q(self.i)] = h.out[self.rows[self.i]]
        for j in range(self.g):
            if j != self.i and len(o):
                out[o, self._q(j)] = self._got(got, self.i, j).view(len(o), self.hq, self.d).to(out.dtype)

    # --- backward ------------------------------------------------------------------------------
    def send_dout(self, dout) -> Dict[tuple, torch.Tensor]:
        """Step 1 mirrored: this block's dO of group j, to member j."""
        o, rid = self.own, self.ring.id
        return {(rid, self.i, self.ring.ranks[j]): self._flat(dout[o][:, self._q(j)])
                for j in range(self.g) if j != self.i}

    def gather_dout(self, got, dout) -> torch.Tensor:
        """dO of the whole documents for this member's group."""
        i = self.i
        hd = dout.new_zeros((self.tokens, self.hq, self.d))
        hd[self.rows[i]] = dout[self.own][:, self._q(i)]
        for b in range(self.g):
            if b != i and len(self.rows[b]):
                hd[self.rows[b]] = self._got(got, b, b).view(-1, self.hq, self.d)
        return hd

    def send_dqkv(self, grads, dtype) -> Dict[tuple, torch.Tensor]:
        """Step 0 mirrored: the dQ/dK/dV rows of member b's block for this group, to member b."""
        rid = self.ring.id
        return {(rid, b, self.ring.ranks[b]): self._flat(*(x[self.rows[b]].to(dtype) for x in grads))
                for b in range(self.g) if b != self.i}

    def place_dqkv(self, got, grads, dq, dk, dv) -> None:
        """This block's gradients: its own group's rows, and group j's as member j sent them."""
        o, i = self.own, self.i
        for x, t, sl in zip(grads, (dq, dk, dv), (self._q(i), self._kv(i), self._kv(i))):
            t[o, sl] += x[self.rows[i]].to(t.dtype)
        for j in range(self.g):
            if j != i and len(o):
                for x, t, sl in zip(self._split(self._got(got, i, j)), (dq, dk, dv), (self._q(j), self._kv(j),
                                                                                    self._kv(j))):
                    t[o, sl] += x.to(t.dtype)

    def _got(self, got, b: int, j: int) -> torch.Tensor:
        """The message of block ``b`` that member ``j`` sent here."""
        t = got.get((self.ring.id, b, self.ring.ranks[j]))
        if t is None:  # a plan bug: every member of the ring exchanges with every other
            raise RuntimeError(f"a2a ring {self.ring.id}: block {b} from member {j} did not arrive")
        return t
