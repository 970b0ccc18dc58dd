"""Cost model: predicted seconds of attention, linear modules and transfers on a profile.

Units: one *block* is a (query chunk, key/value chunk) pair of one document in one layer; costs of
an iteration are forward + backward over all layers. Attention FLOPs count the causal triangle once
(4*q*k*heads*head_dim for a full block, half of the square for a diagonal block); the backward is 2.5x
the forward FLOPs at the profile's backward rate. Linear modules cost 3x their forward FLOPs at the
GEMM rate. A transfer costs latency + bytes / bandwidth of its link (NVLink inside a node, one NIC
across nodes).

Why thresholds are not constants: a document split over a ring of G ranks computes about
attn(L)/G^2 per ring step while it moves L/G tokens of K/V; splitting pays only when the compute of a
step hides its transfer. ``crossover_length`` solves that for the link and ring size, so the classes
follow from the model and the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model_spec import ModelSpec
from ..profile import HardwareProfile
from ..topology import Topology

BWD_FLOPS = 2.5  # backward attention FLOPs / forward FLOPs (FlashAttention convention)
LINEAR_PASSES = 3.0  # forward + backward (input and weight gradients) of a GEMM


@dataclass(frozen=True)
class CostModel:
    model: ModelSpec
    profile: HardwareProfile
    topology: Topology
    tp: int = 1

    # --- attention ------------------------------------------------------------------------
    @property
    def _heads(self) -> int:
        return max(1, self.model.heads // self.tp)

    def block_flops(self, q: int, kv: int, causal: bool) -> float:
        """Forward FLOPs of one attention block in one layer."""
        hd = self._heads * self.model.head_dim
        if causal:  # diagonal block: q == kv, lower triangle incl. diagonal
            return 2.0 * q * (q + 1) * hd
        return 4.0 * q * kv * hd

    def block_s(self, q: int, kv: int, causal: bool, layers: int = 0) -> float:
        """Forward + backward seconds of one block summed over ``layers`` (0 = all layers)."""
        if q <= 0 or kv <= 0:
            return 0.0
        f = self.block_flops(q, kv, causal)
        p = self.profile
        t = f / (p.attn_tflops(q) * 1e12) + BWD_FLOPS * f / (p.attn_tflops(q, backward=True) * 1e12)
        return t * (layers or self.model.layers)

    def block_fwd_s(self, q: int, kv: int, causal: bool) -> float:
        """Forward seconds of one block in one layer."""
        if q <= 0 or kv <= 0:
            return 0.0
        return self.block_flops(q, kv, causal) / (self.profile.attn_tflops(q) * 1e12)

    def doc_attention_s(self, length: int) -> float:
        """Whole document on one GPU, iteration (fwd + bwd, all layers)."""
        return self.block_s(length, length, causal=True)

    # --- linear modules -----------------------------------------------------------------------
    def linear_s(self, tokens: int) -> float:
        """Iteration seconds of QKV/out projections, MLP (all layers) and the vocab head for ``tokens``."""
        m = self.model
        flops = tokens * (m.layers * m.linear_flops_per_token(self.tp) + m.head_flops_per_token(self.tp))
        return LINEAR_PASSES * flops / (self.profile.gemm_tflops * 1e12)

    def proj_flops_per_token(self) -> float:
        """Forward FLOPs per token per layer of the QKV and output projections (one TP rank)."""
        m = self.model
        return 2.0 * (m.hidden * m.heads * m.head_dim + 2 * m.hidden * m.kv_heads * m.head_dim
                      + m.heads * m.head_dim * m.hidden) / self.tp

    def proj_s(self, tokens: int) -> float:
        """Iteration seconds of the QKV and output projections (all layers) for ``tokens``: the
        attention-side linear work, run on the ATTENTION layout (design.md "Where Zeppelin sits").

        The two sides add up to ``linear_s`` (toy model: 24576 + 49152 FLOPs per token and layer,
        plus the vocab head on the MLP side):

        >>> from megatron_zeppelin.planner.testing import toy_context
        >>> c = toy_context().cost
        >>> abs(c.proj_s(1000) + c.mlp_s(1000) - c.linear_s(1000)) < 1e-18
        True
        """
        return LINEAR_PASSES * tokens * self.model.layers * self.proj_flops_per_token() / (self.profile.gemm_tflops * 1e12)

    def mlp_s(self, tokens: int) -> float:
        """Iteration seconds of the MLP (all layers) and the vocab head for ``tokens``: the linear
        work on the LINEAR layout, the only part the remap can move."""
        return self.linear_s(tokens) - self.proj_s(tokens)

    # --- communication ------------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(self.tp)

    @property
    def hidden_bytes_per_token(self) -> int:
        return self.model.hidden * self.model.dtype_bytes

    def link_of(self, src: int, dst: int) -> str:
        return "nvlink" if self.topology.same_node(src, dst) else "nic"

    def bandwidth(self, link: str) -> float:
        return (self.profile.nvlink_GBps if link == "nvlink" else self.profile.nic_GBps) * 1e9

    def latency(self, link: str) -> float:
        return (self.profile.nvlink_latency_us if link == "nvlink" else self.profile.nic_latency_us) * 1e-6

    def tp_allreduce_s(self, tokens, latency: bool = True):
        """One ring all-reduce of ``tokens`` hidden states over the TP group (NVLink; Megatron TP
        without sequence parallelism runs 2 per layer and pass). Works on arrays of token counts;
        ``latency=False`` keeps only the bandwidth term (the lower bound's share of it).

        >>> from megatron_zeppelin.planner.testing import toy_context
        >>> from dataclasses import replace
        >>> c = replace(toy_context().cost, tp=2)
        >>> c.tp_allreduce_s(0), c.tp_allreduce_s(1000, latency=False) == 1000 * c.hidden_bytes_per_token / c.bandwidth("nvlink")
        (0.0, True)
        """
        import numpy as np
        tp = self.tp
        t = np.asarray(tokens, dtype=np.float64)
        lat = self.latency("nvlink") if latency else 0.0
        out = 2 * (tp - 1) * (lat + t * self.hidden_bytes_per_token / tp / self.bandwidth("nvlink")) * (t > 0)
        return float(out) if out.ndim == 0 else out

    def transfer_s(self, nbytes: float, link: str, share: float = 1.0) -> float:
        """One message over ``link`` whose bandwidth is shared ``share`` ways."""
        if nbytes <= 0:
            return 0.0
        return self.latency(link) + nbytes * share / self.bandwidth(link)

    # --- ring crossovers --------------------------------------------------------------------
    def ring_step_compute_s(self, length: int, ring: int) -> float:
        """Forward compute of one zigzag ring step of one member (one layer): two full blocks of
        L/(2G) x L/(2G), i.e. about attn(L) / G^2."""
        c = max(1, length // (2 * ring))
        return 2 * self.block_fwd_s(c, c, False)

    def ring_step_transfer_s(self, length: int, ring: int, link: str, share: float = 1.0) -> float:
        """Forward transfer of one ring step (one layer): L/G tokens of K/V."""
        return self.transfer_s(self.kv_bytes_per_token * length / ring, link, share)

    def crossover_length(self, ring: int, link: str, share: float = 1.0, limit: int = 1 << 26) -> int:
        """Smallest length whose ring step hides its transfer on ``link`` (bisection; monotone)."""
        if ring <= 1:
            return 0

        def hides(L: int) -> bool:
            return self.ring_step_compute_s(L, ring) >= self.ring_step_transfer_s(L, ring, link, share)

        lo, hi = 1, 2 * ring
        while not hides(hi):
            if hi >= limit:
                return limit
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if hides(mid):
                hi = mid
            else:
                lo = mid
        return hi

    # --- vectorised and ring-member estimates (the partitioner's hot path) --------------------
    def attn_tflops_np(self, lengths, backward: bool = False):
        """``profile.attn_tflops`` for an array of lengths (same clamped log2 interpolation)."""
        import numpy as np
        p = self.profile
        ys = p.attn_bwd_tflops if backward else p.attn_fwd_tflops
        x = np.log2(np.maximum(np.asarray(lengths, dtype=np.float64), 1.0))
        return np.interp(x, np.log2(np.asarray(p.attn_seqlen, dtype=np.float64)), np.asarray(ys, dtype=np.float64))

    def block_s_np(self, q, kv, causal: bool):
        """``block_s`` (all layers) for arrays of block shapes; 0 where q or kv is 0.

        >>> from megatron_zeppelin.planner.testing import toy_context
        >>> c = toy_context().cost
        >>> abs(float(c.block_s_np([300], [300], True)[0]) - c.block_s(300, 300, True)) < 1e-15
        True
        """
        import numpy as np
        q = np.asarray(q, dtype=np.float64)
        kv = np.asarray(kv, dtype=np.float64)
        hd = self._heads * self.model.head_dim
        f = 2.0 * q * (q + 1) * hd if causal else 4.0 * q * kv * hd
        t = f / (self.attn_tflops_np(q) * 1e12) + BWD_FLOPS * f / (self.attn_tflops_np(q, True) * 1e12)
        return np.where((q > 0) & (kv > 0), t * self.model.layers, 0.0)

    def doc_attention_np(self, lengths):
        """``doc_attention_s`` for an array of lengths."""
        return self.block_s_np(lengths, lengths, True)

    def ring_member_attention_s(self, length: int, ring: int) -> float:
        """Iteration attention seconds of one member of a zigzag ring of ``ring`` ranks on one
        document: chunks of c = L/(2G); each member computes 2 diagonal and 2G-1 full c x c blocks
        (equal for every member: that is the point of zigzag). ring=1 is the whole document.

        >>> from megatron_zeppelin.planner.testing import toy_context
        >>> c = toy_context().cost
        >>> c.ring_member_attention_s(1000, 1) == c.doc_attention_s(1000)
        True
        >>> c.ring_member_attention_s(1000, 2) > c.doc_attention_s(1000) / 2   # smaller, slower blocks
        True
        """
        if ring <= 1:
            return self.doc_attention_s(length)
        c = max(1, length // (2 * ring))
        return 2 * self.block_s(c, c, True) + (2 * ring - 1) * self.block_s(c, c, False)

    def remap_s_per_token(self, link: str) -> float:
        """Iteration seconds to remap one token over ``link`` (4 exchanges per layer: there and back,
        forward and backward), without latency."""
        return 4 * self.model.layers * self.hidden_bytes_per_token / self.bandwidth(link)
