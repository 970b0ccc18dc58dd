"""Seconds of the compute kernels and TP collectives of one layer on one rank, from the cost model.

Attention blocks use the planner's CostModel (forward at the profile's forward rate; backward 2.5x
the forward FLOPs at the backward rate). The linear modules are split where the layer runs them:
the QKV and output projections on the rank's attention-layout tokens, the MLP on its linear-layout
tokens; backward = 2x forward FLOPs (input and weight gradients). With tensor parallelism each
layer has 2 all-reduces of the activations over the TP group in the forward and 2 in the backward
(Megatron without sequence parallelism); they run on NVLink and block the compute stream.

Toy model (hidden 64, 4 heads of 16, 2 KV heads, FFN 128) at 100 TFLOP/s:

>>> from megatron_zeppelin.planner.testing import toy_context
>>> k = LayerCosts(toy_context().cost)
>>> k.proj_flops_per_token, k.mlp_flops_per_token   # 2*(64*64 + 2*64*32 + 64*64), 2*3*64*128
(24576.0, 49152.0)
>>> k.proj_s(1000) * 1e9   # ns for 1000 tokens, forward
245.76

Off-diagonal ring blocks are full (non-causal) blocks: timed at the profile's full-block rates when
it has them (profile.attn_full_*; a CPU kernel that does not skip masked tiles), else at the causal
rates. ``ring_step_s`` gives every member's compute of every ring step at once (vectorised over the
ring's documents); it equals the block-by-block sum:

>>> from megatron_zeppelin.planner.predict import ring_step_blocks
>>> ring, doc = Ring(0, (0, 1), "intra", (0,)), DocPlan(0, 6000, "intra", 0, -1, (0, 1500, 3000, 4500, 6000))
>>> fwd, bwd = k.ring_step_s(ring, {0: doc})
>>> ref = sum(k.block_fwd_s(*b) for b in ring_step_blocks(ring, {0: doc}, 1, 1))
>>> bool(abs(fwd[1, 1] - ref) < 1e-12 * ref)
True
"""

from __future__ import annotations

import numpy as np

from ..planner.cost_model import BWD_FLOPS, CostModel
from ..planner.types import DocPlan, Ring


class LayerCosts:
    def __init__(self, cost: CostModel):
        self.cost = cost
        m, tp = cost.model, cost.tp
        h, d = m.hidden, m.head_dim
        self.qkv_flops_per_token = 2.0 * (h * m.heads * d + 2 * h * m.kv_heads * d) / tp
        self.out_flops_per_token = 2.0 * m.heads * d * h / tp
        self.proj_flops_per_token = self.qkv_flops_per_token + self.out_flops_per_token
        self.mlp_flops_per_token = 2.0 * 3 * h * m.ffn / tp
        self.head_flops_per_token = m.head_flops_per_token(tp)
        self.rate = cost.profile.gemm_tflops * 1e12
        # fixed seconds per attention block call (profile; 0 for the GPU presets)
        self.call_fwd = cost.profile.attn_call_fwd_us * 1e-6
        self.call_bwd = cost.profile.attn_call_bwd_us * 1e-6

    # Forward seconds; the backward of a GEMM is twice its forward.
    def proj_s(self, tokens: int) -> float:
        return tokens * self.proj_flops_per_token / self.rate

    def qkv_s(self, tokens: int) -> float:
        return tokens * self.qkv_flops_per_token / self.rate

    def out_s(self, tokens: int) -> float:
        return tokens * self.out_flops_per_token / self.rate

    def mlp_s(self, tokens: int) -> float:
        return tokens * self.mlp_flops_per_token / self.rate

    def head_iteration_s(self, tokens: int) -> float:
        """Vocab head forward + backward (once per iteration, on the linear layout)."""
        return 3.0 * tokens * self.head_flops_per_token / self.rate

    def tp_allreduce_s(self, tokens: int) -> float:
        """One ring all-reduce of ``tokens`` hidden states over the TP group (NVLink)."""
        return float(self.cost.tp_allreduce_s(tokens))

    # Attention blocks: (q, kv, causal) of one layer.
    def block_fwd_s(self, q: int, kv: int, causal: bool) -> float:
        if not causal and self.cost.profile.attn_full_fwd_tflops:
            return self._full_s(q, kv, False)
        return self.cost.block_fwd_s(q, kv, causal) + (self.call_fwd if q > 0 and kv > 0 else 0.0)

    def block_bwd_s(self, q: int, kv: int, causal: bool) -> float:
        if not causal and self.cost.profile.attn_full_fwd_tflops:
            return self._full_s(q, kv, True)
        t = self.cost.block_s(q, kv, causal, 1) - self.cost.block_fwd_s(q, kv, causal)
        return t + (self.call_bwd if q > 0 and kv > 0 else 0.0)

    def _full_s(self, q: int, kv: int, backward: bool) -> float:
        """A full block at the profile's full-block rate (only when the profile has that table)."""
        if q <= 0 or kv <= 0:
            return 0.0
        hd = max(1, self.cost.model.heads // self.cost.tp) * self.cost.model.head_dim
        fl = 4.0 * q * kv * hd * (BWD_FLOPS if backward else 1.0)
        return fl / float(self._rate(np.array([q]), backward, True)[0]) + (self.call_bwd if backward else self.call_fwd)

    # Vectorised: every (member, step) of a zigzag ring.
    def _rate(self, q: np.ndarray, backward: bool, full: bool = False) -> np.ndarray:
        p = self.cost.profile
        ys = p.attn_bwd_tflops if backward else p.attn_fwd_tflops
        if full and p.attn_full_fwd_tflops:  # the profile's own table for non-causal blocks
            ys = p.attn_full_bwd_tflops if backward else p.attn_full_fwd_tflops
        # the profile interpolates linearly in log2(length) and clamps at both ends, as np.interp does
        return np.interp(np.log2(np.maximum(q, 1)), np.log2(p.attn_seqlen), ys) * 1e12

    def ring_step_s(self, ring: Ring, docs) -> tuple:
        """(forward, backward) seconds of one layer, arrays [member, step]: member i at step s
        computes its chunks i and 2G-1-i against those of member (i - s) mod G (causal: kv chunk <= q chunk)."""
        g = ring.size
        b = np.array([docs[d].bounds for d in ring.docs], dtype=float)  # [docs, 2G+1]
        ch = np.diff(b, axis=1)  # chunk sizes [docs, 2G]
        hd = max(1, self.cost.model.heads // self.cost.tp) * self.cost.model.head_dim
        fwd = np.zeros((g, g))
        bwd = np.zeros((g, g))
        for i in range(g):
            for s in range(g):
                j = (i - s) % g
                for a in (i, 2 * g - 1 - i):
                    q = ch[:, a]
                    for kb in (j, 2 * g - 1 - j):
                        if kb > a:
                            continue
                        k = ch[:, kb]
                        diag = kb == a  # causal diagonal block, else a full one
                        fl = 2.0 * q * (q + 1) * hd if diag else 4.0 * q * k * hd
                        rf, rb = self._rate(q, False, not diag), self._rate(q, True, not diag)
                        live = (q > 0) & (k > 0)
                        fl = np.where(live, fl, 0.0)
                        calls = int(live.sum())  # one kernel call per visible block
                        fwd[i, s] += float((fl / rf).sum()) + calls * self.call_fwd
                        bwd[i, s] += float((BWD_FLOPS * fl / rb).sum()) + calls * self.call_bwd
        return fwd, bwd
