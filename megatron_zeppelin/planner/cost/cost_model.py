"""Cost model: predicted seconds of attention, linear modules and transfers on a profile.

The one place a cost formula is written: the partitioner, the prediction (predict.py) and the
simulator (sim/compute.py) all price work here, so the planner optimises what the simulator times.

Units: one *block* is a (query chunk, key/value chunk) pair of one document in one layer; costs of
an iteration are forward + backward over all layers. A kernel call runs *sequences* (a query chunk
with every key it attends in that call); on a profile priced by sequence (``attention.by_sequence``,
the GPU presets: FlashAttention's curves are per sequence) every block runs at its sequence's rate,
the table of the sequence's mask at its keys (``block_flops_s`` with ``keys`` / ``masked``;
program.py ``call_blocks_s`` groups a call's blocks), and every point-to-point message pays the
profile's ``message_us`` on top of its link's latency (``latency``). ``block_pass_s`` is the one block-cost
function (vectorised over query length, key length and causal-or-full, forward or backward):
attention FLOPs count the causal triangle once (4*q*k*heads*head_dim for a full block, half of the
square for a diagonal block); the backward is 2.5x the forward FLOPs at the profile's backward
rate; full blocks run at the profile's full-block table when it has one
(``attention.full_fwd_tflops`` / ``full_bwd_tflops``); every *sequence* of a kernel call (a query
chunk with all the key blocks it attends in that call, which the kernels merge) adds the profile's
fixed seconds per sequence (``seq_s``: ``attention.seq_fwd_us``; a block alone is one sequence, as
``block_pass_s`` prices it; one mixing full keys with a causal run counts twice, as the CPU kernel
splits it: program.py ``sequences_per``), and every kernel call its fixed seconds per call
(``call_s``: the engine makes one call per rank per Compute of the layer program, program.py).
Ranks sharing one host CPU (the CPU validation: ``host``, a spec/host.py HostModel, None on GPUs)
add the merge of a split sequence and the engine's CPU per Post, Wait and pass, priced there.
``gemm_s`` is the one linear function: linear modules cost 3x their forward FLOPs at the GEMM rate. A transfer costs latency + bytes / bandwidth of its link (NVLink inside a
node, one NIC across nodes); the DP gradient all-reduce is ``dp_allreduce_s``.

Why thresholds are not constants: a document split over a ring of G ranks computes about
attn(L)/G^2 per ring step while it moves L/G tokens of K/V; splitting pays only when the compute of a
step hides its transfer. ``crossover_length`` solves that for the link and ring size, so the classes
follow from the model and the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Optional

import numpy as np

from megatron_zeppelin.spec.memory import sp_rows
from megatron_zeppelin.spec.model import ModelSpec
from megatron_zeppelin.spec.hardware import HardwareProfile
from megatron_zeppelin.spec.host import HostModel
from megatron_zeppelin.spec.recompute import Recompute
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.spec.words import LINKS, Link

BWD_FLOPS = 2.5  # backward attention FLOPs / forward FLOPs (FlashAttention convention)
LINEAR_PASSES = 3.0  # forward + backward (input and weight gradients) of a GEMM


def attention_flops(q, kv, causal, head_width: int):
    """Forward FLOPs of attention blocks (arrays or scalars) over ``head_width`` = heads x head_dim:
    a causal (diagonal) block, q == kv, counts its lower triangle with the diagonal; a full block
    q x kv (CostModel.block_flops; the CPU calibration counts its probes' FLOPs with it too).

    >>> attention_flops(2, 2, True, 1), attention_flops(2, 3, False, 1)
    (12.0, 24.0)
    """
    q = np.asarray(q, dtype=np.float64)
    out = np.where(causal, 2.0 * q * (q + 1) * head_width, 4.0 * q * np.asarray(kv, dtype=np.float64) * head_width)
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class CostModel:
    model: ModelSpec
    profile: HardwareProfile
    topology: Topology
    tp: int = 1
    # What the backward recomputes (spec/recompute.py): the layer program runs that forward again
    # (predict.py, sim/layer.py) and the lower bound counts it.
    recompute: Recompute = Recompute()
    sp: bool = False  # Megatron's --sequence-parallel (tp > 1): TP all-reduces become AG + RS
    # Ranks sharing one host CPU (spec/host.py: the CPU validation's only; None on GPUs): its
    # engine CPU per Post / Wait / pass and the CPU kernel's split sequences, which the layer
    # program's pricing (program.py), the prediction and the simulator add where it is not None.
    host: Optional[HostModel] = None

    # --- attention: the one block-cost function -----------------------------------------------
    @property
    def _heads(self) -> int:
        return max(1, self.model.heads // self.tp)

    def block_flops(self, q, kv, causal):
        """Forward FLOPs of attention blocks in one layer (arrays or scalars): a causal (diagonal)
        block, q == kv, counts its lower triangle with the diagonal; a full block q x kv."""
        return attention_flops(q, kv, causal, self._heads * self.model.head_dim)

    def attn_rate(self, length, causal=True, backward: bool = False):
        """FLOP/s of attention at ``length`` (a sequence's keys on a profile priced by sequence, a
        block's query rows otherwise: ``profile.attn_by_sequence``): the profile's causal table, or
        its full-block table for full ones when it has one (a kernel that does not skip masked tiles
        makes the two differ); interpolated in log2(length) and clamped above; below the first point
        clamped too, or, below ``attention.tile_tokens``, in proportion to the length (a shorter
        sequence still runs a whole tile: its time stops shrinking with its FLOPs).

        >>> from dataclasses import replace
        >>> from megatron_zeppelin.planner.testing import toy_context
        >>> c = toy_context().cost
        >>> t = replace(c, profile=replace(c.profile, attn_tile_tokens=int(c.profile.attn_seqlen[0])))
        >>> n = c.profile.attn_seqlen[0]
        >>> bool(c.attn_rate(n // 2) == c.attn_rate(n)), bool(abs(t.attn_rate(n // 2) * 2 - c.attn_rate(n)) < 1)
        (True, True)
        """
        xs, causal_table, full_table = self._attn_tables[backward]
        n = np.maximum(np.asarray(length, dtype=np.float64), 1.0)
        x = np.log2(n)
        rate = np.interp(x, xs, causal_table)
        if full_table is not None:
            rate = np.where(causal, rate, np.interp(x, xs, full_table))
        tile = self.profile.attn_tile_tokens
        if tile:
            rate = rate * np.minimum(1.0, n / tile)
        return rate * 1e12

    @cached_property
    def _attn_tables(self):  # per pass: (log2 lengths, causal TFLOP/s, full TFLOP/s or None), as arrays
        p, f = self.profile, np.float64
        xs = np.log2(np.asarray(p.attn_seqlen, dtype=f))
        full = (p.attn_full_fwd_tflops, p.attn_full_bwd_tflops) if p.attn_full_fwd_tflops else (None, None)
        return {bw: (xs, np.asarray(p.attn_bwd_tflops if bw else p.attn_fwd_tflops, dtype=f),
                     None if full[bw] is None else np.asarray(full[bw], dtype=f)) for bw in (False, True)}

    def block_flops_s(self, q, kv, causal, backward: bool = False, keys=None, masked=None):
        """Seconds of the FLOPs of attention blocks in one layer, one pass (forward, or backward:
        2.5x the forward FLOPs at the backward rate), without fixed costs; 0 where q or kv is 0.
        Each block runs at the rate of the kernel sequence it is part of: ``keys`` (its keys) and
        ``masked`` (it ends in a causal run) of that sequence, by default the block alone (a
        sequence of its own); a profile not priced by sequence reads each block's own query rows.
        Vectorised over every argument: the partitioner, the prediction and the simulator all price
        attention here (program.py groups a call's blocks into sequences and adds a fixed ``seq_s``
        per sequence, ``call_s`` per call)."""
        q = np.asarray(q, dtype=np.float64)
        kv = np.asarray(kv, dtype=np.float64)
        f = self.block_flops(q, kv, causal) * (BWD_FLOPS if backward else 1.0)
        if self.profile.attn_by_sequence:
            at, mask = (kv if keys is None else keys), (causal if masked is None else masked)
        else:
            at, mask = q, causal
        return np.where((q > 0) & (kv > 0), f / self.attn_rate(at, mask, backward), 0.0)

    def least_flops_s(self, q, backward: bool = False):
        """Seconds of a causal q x q block's FLOPs at the fastest rate any sequence of at most q keys
        runs at (the larger of the causal and the full table at q: the tables grow with length), for
        the lower bound: a split document's sequences have no more keys than the document."""
        q = np.asarray(q, dtype=np.float64)
        f = self.block_flops(q, q, True) * (BWD_FLOPS if backward else 1.0)
        rate = np.maximum(self.attn_rate(q, True, backward), self.attn_rate(q, False, backward))
        return np.where(q > 0, f / rate, 0.0)

    def seq_s(self, backward: bool = False) -> float:
        """Fixed seconds of one sequence of a kernel call: a query chunk with every key block it
        attends in that call (the kernels merge them into one sequence: attention/kernels/pieces.py)."""
        return (self.profile.attn_seq_bwd_us if backward else self.profile.attn_seq_fwd_us) * 1e-6

    def block_pass_s(self, q, kv, causal, backward: bool = False):
        """Seconds of attention blocks each a sequence of its own (a local document; the estimates
        of whole documents and ring members): ``block_flops_s`` plus ``seq_s`` (the kernel call
        they are packed in is ``call_s``); 0 where q or kv is 0.

        >>> from megatron_zeppelin.planner.testing import toy_context
        >>> c = toy_context().cost
        >>> c.block_pass_s([300, 0], [300, 5], [True, False]).tolist()[1], c.block_fwd_s(300, 300, True) > 0
        (0.0, True)
        """
        sec = self.block_flops_s(q, kv, causal, backward)
        return np.where(sec > 0, sec + self.seq_s(backward), 0.0)

    def call_s(self, backward: bool = False) -> float:
        """Fixed seconds of one attention kernel call (one per rank per Compute that has blocks)."""
        return (self.profile.attn_call_bwd_us if backward else self.profile.attn_call_fwd_us) * 1e-6

    def block_fwd_s(self, q: int, kv: int, causal: bool) -> float:
        """Forward seconds of one block in one layer."""
        return float(self.block_pass_s(q, kv, causal))

    def block_bwd_s(self, q: int, kv: int, causal: bool) -> float:
        """Backward seconds of one block in one layer."""
        return float(self.block_pass_s(q, kv, causal, True))

    def block_s_np(self, q, kv, causal):
        """Forward + backward seconds of blocks summed over all layers (arrays)."""
        return (self.block_pass_s(q, kv, causal) + self.block_pass_s(q, kv, causal, True)) * self.model.layers

    def block_s(self, q: int, kv: int, causal: bool, layers: int = 0) -> float:
        """Forward + backward seconds of one block summed over ``layers`` (0 = all layers)."""
        one = float(self.block_pass_s(q, kv, causal) + self.block_pass_s(q, kv, causal, True))
        return one * (layers or self.model.layers)

    def doc_attention_s(self, length: int) -> float:
        """Whole document on one GPU, iteration (fwd + bwd, all layers)."""
        return self.block_s(length, length, causal=True)

    def doc_attention_np(self, lengths):
        """``doc_attention_s`` for an array of lengths."""
        return self.block_s_np(lengths, lengths, True)

    # --- linear modules: the one FLOPs function ------------------------------------------------
    def linear_flops_per_token(self, part: str) -> float:
        """Forward FLOPs per token of one linear part on one TP rank: ``qkv`` and ``out`` (the
        projections, per layer), ``mlp`` (SwiGLU, per layer), ``head`` (the vocab head, once)."""
        return 2.0 * self.model.matmul_params()[part] / self.tp

    def gemm_s(self, tokens, part: str):
        """Forward seconds of one linear part for ``tokens`` (scalar or array; per layer, or once
        for ``head``); its backward is twice that (input and weight gradients)."""
        return np.asarray(tokens, dtype=np.float64) * self.linear_flops_per_token(part) / (self.profile.gemm_tflops * 1e12)

    def linear_s(self, tokens: int) -> float:
        """Iteration seconds of QKV/out projections, MLP (all layers) and the vocab head for ``tokens``."""
        return self.proj_s(tokens) + self.mlp_s(tokens)

    def proj_s(self, tokens: int) -> float:
        """Iteration seconds of the QKV and output projections (all layers) for ``tokens``: the
        attention-side linear work, run on the ATTENTION layout (design.md "Where Zeppelin sits").

        The two sides add up to ``linear_s`` (toy model: 24576 + 49152 FLOPs per token and layer,
        plus the vocab head on the MLP side):

        >>> from megatron_zeppelin.planner.testing import toy_context
        >>> c = toy_context().cost
        >>> c.linear_flops_per_token("qkv") + c.linear_flops_per_token("out"), c.linear_flops_per_token("mlp")
        (24576.0, 49152.0)
        >>> abs(c.proj_s(1000) + c.mlp_s(1000) - c.linear_s(1000)) < 1e-18
        True
        """
        return float(self.proj_s_np(tokens))

    def proj_s_np(self, tokens: np.ndarray) -> np.ndarray:
        """``proj_s`` per entry of an array (ranks' token counts priced in one call).

        >>> from megatron_zeppelin.planner.testing import toy_context
        >>> c = toy_context().cost
        >>> c.proj_s_np(np.array([0, 7, 1000])).tolist() == [c.proj_s(t) for t in (0, 7, 1000)]
        True
        """
        return LINEAR_PASSES * self.model.layers * (self.gemm_s(tokens, "qkv") + self.gemm_s(tokens, "out"))

    def mlp_s(self, tokens: int) -> float:
        """Iteration seconds of the MLP (all layers) and the vocab head for ``tokens``: the linear
        work on the LINEAR layout, the only part the remap can move."""
        return LINEAR_PASSES * float(self.model.layers * self.gemm_s(tokens, "mlp") + self.gemm_s(tokens, "head"))

    # --- communication ------------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(self.tp)

    @property
    def hidden_bytes_per_token(self) -> int:
        return self.model.hidden * self.model.dtype_bytes

    def link_of(self, src: int, dst: int) -> Link | str:
        """The link class joining two ranks: the lowest cluster level that holds both (the profile's
        levels: nvlink, nic, then any further level such as a spine; Topology.level_of)."""
        if self.topology.same_node(src, dst):
            return Link.NVLINK
        return self.link_classes[self.topology.level_of(src, dst, self.profile.spans)]

    @cached_property
    def link_classes(self) -> tuple:
        """Every link class of the profile, innermost first (Link members for nvlink and nic)."""
        return tuple(Link(k) if k in LINKS else k for k in self.profile.links)

    @cached_property
    def _links(self):  # {link: (bytes per second, seconds of one message's latency)}: a hot path of predict
        msg = self.profile.message_us
        return {k: (gbps * 1e9, (us + msg) * 1e-6) for k, (gbps, us) in self.profile.links.items()}

    def bandwidth(self, link: str) -> float:
        """Bytes per second of one link of class ``link``, from the profile's link table."""
        return self._links[link][0]

    def latency(self, link: str) -> float:
        """Fixed seconds of one point-to-point message (a hop) on ``link``: the link's latency plus
        the profile's per-message overhead (``message_us``: the NCCL op's launch, a relay's handoff)."""
        return self._links[link][1]

    def link_latency(self, link: str) -> float:
        """The link's own latency, per step of a collective (NCCL's ring all-reduce: one launch)."""
        return self.profile.links[link][1] * 1e-6

    @property
    def overlap_slowdown(self) -> float:
        """Fraction by which a kernel slows while an NCCL exchange of its rank is in flight."""
        return self.profile.overlap_slowdown

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
        tp = self.tp
        t = np.asarray(tokens, dtype=np.float64)
        lat = self.link_latency(Link.NVLINK) if latency else 0.0
        out = 2 * (tp - 1) * (lat + t * self.hidden_bytes_per_token / tp / self.bandwidth(Link.NVLINK)) * (t > 0)
        return float(out) if out.ndim == 0 else out

    # --- sequence parallelism (Megatron's --sequence-parallel) -------------------------------
    def layout_rows(self, tokens):
        """Rows a rank's layout of ``tokens`` tokens has: with sequence parallelism a multiple of the
        TP size (megatron splits it along tokens; the pad rows are computed, never attended to),
        and at least one row per TP rank. Works on arrays.

        >>> from megatron_zeppelin.planner.testing import toy_context
        >>> from dataclasses import replace
        >>> c = replace(toy_context().cost, tp=2, sp=True)
        >>> c.layout_rows(0), c.layout_rows(5), c.layout_rows(6), replace(c, sp=False).layout_rows(5)
        (2, 6, 6, 5)
        """
        t = np.asarray(tokens, dtype=np.int64)
        if self.sp and self.tp > 1:
            t = np.asarray(sp_rows(t, self.tp))  # the one rule, shared with the memory model
        return int(t) if t.ndim == 0 else t

    def sp_allgather_s(self, tokens, latency: bool = True):
        """One ring all-gather (or reduce-scatter: the same bytes) of a layout of ``tokens``
        hidden states over the TP group (NVLink): each TP rank receives (TP-1)/TP of the rows.
        Sequence parallelism runs one of each where TP without it runs one all-reduce, so a layer
        pass costs the same bytes; the remap adds one all-gather of its source layout (it remaps
        the whole layout over the DP-CP ranks of each TP rank). Works on arrays.

        >>> from megatron_zeppelin.planner.testing import toy_context
        >>> from dataclasses import replace
        >>> c = replace(toy_context().cost, tp=2, sp=True)
        >>> bool(2 * c.sp_allgather_s(1000) == c.tp_allreduce_s(1000)), c.sp_allgather_s(0)
        (True, 0.0)
        """
        return 0.5 * self.tp_allreduce_s(tokens, latency)

    def tp_comm_s(self, tokens, latency: bool = True):
        """Megatron's TP communication of one layout in one layer pass (after the attention or
        the MLP block): one all-reduce without sequence parallelism; with it, the all-gather
        before the block and the reduce-scatter after it, on the padded rows. Works on arrays."""
        if self.sp and self.tp > 1:
            return 2 * self.sp_allgather_s(self.layout_rows(tokens), latency)
        return self.tp_allreduce_s(tokens, latency)

    def dp_allreduce_s(self, grad_bytes_per_param: int = 4) -> float:
        """The data-parallel gradient all-reduce of one iteration over every rank of the domain
        (the same for every strategy: it depends on the model and the domain, not on the plan),
        gradients in fp32 as Megatron reduces them by default for bf16 training."""
        nbytes = self.model.params() / self.tp * grad_bytes_per_param
        return ring_allreduce_s(nbytes, self.topology, self.bandwidth(Link.NVLINK), self.bandwidth(Link.NIC),
                                self.link_latency(Link.NVLINK), self.link_latency(Link.NIC))

    def transfer_s(self, nbytes: float, link: str, share: float = 1.0) -> float:
        """One message over ``link`` whose bandwidth is shared ``share`` ways."""
        if nbytes <= 0:
            return 0.0
        return self.latency(link) + nbytes * share / self.bandwidth(link)

    # --- ring crossovers --------------------------------------------------------------------
    def ring_step_compute_s(self, length, ring: int):
        """Forward compute of one zigzag ring step of one member (one layer): two full blocks of
        L/(2G) x L/(2G), i.e. about attn(L) / G^2. A length or an array of lengths."""
        c = np.maximum(1, np.asarray(length, dtype=np.int64) // (2 * ring))
        out = 2 * self.block_pass_s(c, c, False)
        return float(out) if out.ndim == 0 else out

    def ring_step_transfer_s(self, length, ring: int, link: str, share: float = 1.0):
        """Forward transfer of one ring step (one layer): L/G tokens of K/V (``transfer_s``'s
        arithmetic). A length or an array of lengths."""
        nbytes = self.kv_bytes_per_token * np.asarray(length, dtype=np.int64) / ring
        out = np.where(nbytes > 0, self.latency(link) + nbytes * share / self.bandwidth(link), 0.0)
        return float(out) if out.ndim == 0 else out

    @cached_property
    def _crossovers(self) -> dict:  # crossover_length's answers: the model is immutable, they are too
        return {}

    def crossover_length(self, ring: int, link: str, share: float = 1.0, limit: int = 1 << 26) -> int:
        """Smallest length whose ring step hides its transfer on ``link``: doubling from 2 x ring,
        then bisection (the step compute is flat over each chunk size, so near the crossover the
        predicate is not monotone and the bisection's path fixes the answer). Both price lengths
        on arrays: every doubling at once, then the midpoints of the next BISECT_LEVELS levels of
        the bisection at once (50 scalar cost calls were a tenth of the time to plan 1k documents).
        Kept per model: a run's Planner asks the same crossovers for every batch."""
        key = (ring, link, share, limit)
        if key not in self._crossovers:
            self._crossovers[key] = self._crossover_length(ring, link, share, limit)
        return self._crossovers[key]

    def _crossover_length(self, ring: int, link: str, share: float, limit: int) -> int:
        if ring <= 1:
            return 0

        def hides(lengths) -> np.ndarray:
            return self.ring_step_compute_s(lengths, ring) >= self.ring_step_transfer_s(lengths, ring, link, share)
        his = [2 * ring]
        while his[-1] < limit:
            his.append(his[-1] * 2)
        ok = hides(his)
        if not ok.any():
            return limit
        k = int(np.argmax(ok))
        lo, hi = (his[k - 1] if k else 1), his[k]
        while hi - lo > 1:
            mids = _bisection_mids(lo, hi, BISECT_LEVELS)
            held = dict(zip(mids, hides(mids).tolist()))
            for _ in range(BISECT_LEVELS):
                if hi - lo <= 1:
                    break
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if held[mid] else (mid, hi)
        return hi

    # --- ring-member estimates (the partitioner's hot path) ---------------------------------
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
        return float(self.ring_member_attention_np([length], [ring])[0])

    def ring_member_attention_np(self, lengths, rings, passes=(False, True), calls: bool = True) -> np.ndarray:
        """``ring_member_attention_s`` for arrays of lengths and ring sizes (the same arithmetic);
        ``passes``: (False,) for the forward alone (what recompute runs again), (True,) the backward;
        ``calls``: with a kernel call per ring step (False: without, as a bound must: the documents
        of a ring share each step's call). On a profile priced by sequence, as the calls run: at
        its own step a member's early chunk is a causal sequence of c keys, its later chunk one of
        2c (c full, then c causal); at each later step its two full blocks are one sequence of 2c
        keys (kv member after it) or two of c (before it): half of the steps each, the mean member.

        >>> from megatron_zeppelin.planner.testing import toy_context
        >>> c = toy_context().cost
        >>> c.ring_member_attention_np([1000, 8000], [1, 4]).tolist() == [c.ring_member_attention_s(1000, 1),
        ...                                                              c.ring_member_attention_s(8000, 4)]
        True
        >>> f, b = (c.ring_member_attention_np([8000], [4], passes=(p,)) for p in (False, True))
        >>> bool(abs(f + b - c.ring_member_attention_np([8000], [4]))[0] < 1e-15)
        True
        """
        L, G = np.asarray(lengths, dtype=np.int64), np.asarray(rings, dtype=np.int64)
        c = np.maximum(1, L // (2 * np.maximum(G, 1)))

        def blocks(q, causal):  # block_s_np for both passes: (forward + backward) x layers
            return sum(self.block_pass_s(q, q, causal, p) for p in passes) * self.model.layers
        per_call = G * sum(self.call_s(p) for p in passes) * self.model.layers if calls else 0.0
        if self.profile.attn_by_sequence:
            c2 = 2.0 * c

            def member(p):  # one layer, one pass, the mean member (docstring)
                def f(causal, keys, masked):
                    return self.block_flops_s(c, c, causal, p, keys=keys, masked=masked)
                own = f(True, c, True) + f(False, c2, True) + f(True, c2, True)
                later = (G - 1) * (f(False, c, False) + f(False, c2, False))
                return own + later + (2 + 1.5 * (G - 1)) * self.seq_s(p)
            ring = sum(member(p) for p in passes) * self.model.layers + per_call
        else:
            ring = 2 * blocks(c, True) + (2 * G - 1) * blocks(c, False) + per_call
        return np.where(G <= 1, blocks(L, True), ring)


BISECT_LEVELS = 7  # bisection levels whose midpoints (127) crossover_length prices in one call


def _bisection_mids(lo: int, hi: int, levels: int) -> list:
    """Every midpoint a bisection of (lo, hi] can visit in its next ``levels`` steps.

    >>> sorted(_bisection_mids(0, 8, 2))
    [2, 4, 6]
    """
    out, todo = [], [(lo, hi, levels)]
    while todo:
        a, b, d = todo.pop()
        if d and b - a > 1:
            m = (a + b) // 2
            out.append(m)
            todo += [(a, m, d - 1), (m, b, d - 1)]
    return out


def ring_allreduce_s(nbytes: float, topo: Topology, nvlink_Bps: float, nic_Bps: float,
                     nvlink_lat: float, nic_lat: float) -> float:
    """NCCL's ring all-reduce of ``nbytes`` over every rank of ``topo``: 2(W-1)/W of the bytes
    through every rank. Inside a node the ring runs on NVLink; across nodes each channel crosses a
    node boundary on one NIC and NCCL runs one channel per NIC, so the bus bandwidth is
    min(NVLink, NICs per node x NIC bandwidth).

    >>> ring_allreduce_s(8e9, Topology(2, 8, 4), nvlink_Bps=155e9, nic_Bps=22e9, nvlink_lat=0.0, nic_lat=0.0)  # 2*15/16*8e9 / 88e9
    0.17045454545454544
    """
    w = topo.world_size
    if w <= 1 or nbytes <= 0:
        return 0.0
    if topo.nodes == 1:
        bw, lat = nvlink_Bps, nvlink_lat
    else:
        bw, lat = min(nvlink_Bps, topo.nics_per_node * nic_Bps), nic_lat
    return 2 * (w - 1) * lat + 2 * (w - 1) / w * nbytes / bw
