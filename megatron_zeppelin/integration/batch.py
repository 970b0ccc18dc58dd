"""The batch path: one global micro-batch of documents -> this rank's tensors, driven by the plan.

Every rank of the domain plans the same documents (same lengths -> same plan) and takes its share:
input tokens and position ids in the attention layout (embedding, attention), labels in the linear
layout (the last layer leaves hidden states there for the final norm, vocab head and loss). A
document of L+1 tokens trains L positions: input token j predicts token j+1.

Worked example: one rank, documents [10 11 12 13] and [20 21 22] (L = 3 and 2), all local:

>>> import torch
>>> from megatron_zeppelin.planner.types import Segment
>>> docs = [torch.tensor([10, 11, 12, 13]), torch.tensor([20, 21, 22])]
>>> att = (Segment(1, 0, 2), Segment(0, 0, 3))
>>> gather_tokens(docs, att).tolist(), gather_positions(att).tolist(), gather_tokens(docs, att, shift=1).tolist()
([20, 21, 10, 11, 12], [0, 1, 0, 1, 2], [21, 22, 11, 12, 13])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from megatron.core.packed_seq_params import PackedSeqParams

from megatron_zeppelin.planner.types import Plan, PlanError, Segment, cu_seqlens


@dataclass
class ZeppelinPackedSeqParams(PackedSeqParams):
    """PackedSeqParams (qkv_format 'thd') carrying this micro-batch's plan and engine.

    cu_seqlens_q/kv stay None on purpose: megatron would then restart RoPE positions at every
    segment, which is wrong for zigzag chunks; positions come per token from the plan instead
    (layer.py), and max_seqlen_q/kv are the longest document so the rotary table covers them. ``segment_cu_seqlens`` are the attention-layout segment bounds on this rank."""
    plan: Optional[Plan] = None
    rank: int = 0
    group: Any = None
    engine: Any = None
    remap: bool = False
    max_position: int = 0
    position_ids: Optional[torch.Tensor] = None  # [1, t_att] (pad rows at position 0)
    segment_cu_seqlens: Optional[torch.Tensor] = None
    # Pad rows at the end of a layout: outside the plan, never attended to, cut before remap and
    # loss. megatron-core cannot run a 0-token micro-batch (one pad row), and with sequence
    # parallelism each layout is a multiple of the TP size (megatron splits it along tokens).
    pad_attention: int = 0
    pad_linear: int = 0
    # --sequence-parallel: the TP group. Between layers a TP rank holds 1/T of the rows; the remap
    # gathers them (the same all-gather linear_qkv / linear_fc1 do), remaps the whole layout over
    # this TP rank's domain group, and keeps its 1/T share of the result.
    sp_group: Any = None

    def to_linear(self, x: torch.Tensor) -> torch.Tensor:
        from megatron_zeppelin.remapping import remap_to_linear
        x = self._gather(x)
        y = remap_to_linear(x[:x.shape[0] - self.pad_attention], self.plan, self.rank, self.group)
        return self._scatter(_pad(y, self.pad_linear))

    def to_attention(self, y: torch.Tensor) -> torch.Tensor:
        from megatron_zeppelin.remapping import remap_to_attention
        y = self._gather(y)
        x = remap_to_attention(y[:y.shape[0] - self.pad_linear], self.plan, self.rank, self.group)
        return self._scatter(_pad(x, self.pad_attention))

    def _gather(self, x: torch.Tensor) -> torch.Tensor:
        # [t/T, 1, h] -> [t, 1, h]. The gradient of the whole layout is the same on every TP rank
        # (the remap and _scatter's all-gather make it so), so the backward keeps its own share
        # (split) instead of summing T copies (tensor_parallel_output_grad=False).
        if self.sp_group is None:
            return x
        from megatron.core.tensor_parallel import gather_from_sequence_parallel_region
        return gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=False, group=self.sp_group)

    def _scatter(self, x: torch.Tensor) -> torch.Tensor:
        # [t, 1, h] -> this TP rank's [t/T, 1, h]; backward all-gathers the gradient
        if self.sp_group is None:
            return x
        from megatron.core.tensor_parallel import scatter_to_sequence_parallel_region
        return scatter_to_sequence_parallel_region(x, group=self.sp_group)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The engine on the plan's rows; pad rows get a zero output."""
        n = q.shape[0] - self.pad_attention
        return _pad(self.engine(q[:n], k[:n], v[:n]), self.pad_attention)


def _pad(x: torch.Tensor, n: int) -> torch.Tensor:
    return torch.cat([x, x.new_zeros((n,) + tuple(x.shape[1:]))]) if n else x


@dataclass
class RankBatch:
    tokens: torch.Tensor  # [1, t_att] attention layout
    position_ids: torch.Tensor  # [1, t_att] position inside the document
    labels: torch.Tensor  # [1, t_lin] linear layout
    packed_seq_params: ZeppelinPackedSeqParams
    domain_tokens: int  # loss denominator: trained tokens of the whole domain
    label_tokens: int  # real (non-pad) labels on this rank


def gather_tokens(docs: Sequence[torch.Tensor], segs: Sequence[Segment], shift: int = 0) -> torch.Tensor:
    if not segs:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([docs[s.doc][s.start + shift:s.stop + shift] for s in segs]).long()


def gather_positions(segs: Sequence[Segment]) -> torch.Tensor:
    if not segs:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([torch.arange(s.start, s.stop) for s in segs])


def check_docs(docs: Sequence[torch.Tensor], plan: Plan) -> None:
    lengths = tuple(int(d.numel()) - 1 for d in docs)
    if lengths != tuple(plan.lengths):
        raise PlanError(f"plan was made for {len(plan.lengths)} documents with lengths "
                        f"{list(plan.lengths)[:8]}..., but the batch has {len(lengths)} with "
                        f"{list(lengths)[:8]}...: plan the batch you train on")


def default_engine_factory(plan, rank, group, softmax_scale, counters, kernel="auto"):
    from megatron_zeppelin.attention.engine import AttentionEngine
    return AttentionEngine(plan, rank, group, softmax_scale=softmax_scale, counters=counters, backend=kernel)


def pad_rows(tokens: int, multiple: int = 1) -> int:
    """Pad rows after ``tokens`` rows: up to a multiple of ``multiple`` (the TP size with sequence
    parallelism), and at least one row per TP rank when the layout is empty.

    >>> [pad_rows(n, 1) for n in (0, 5)], [pad_rows(n, 2) for n in (0, 5, 6)]
    ([1, 0], [2, 1, 0])
    """
    return multiple if tokens == 0 else -tokens % multiple


def build_rank_batch(docs: Sequence[torch.Tensor], plan: Plan, rank: int, group, *, softmax_scale: float,
                     device=None, counters=None, engine_factory: Callable = default_engine_factory,
                     sp_group=None) -> RankBatch:
    """This rank's tensors for one planned micro-batch (``docs``: L+1 token ids per document).
    ``sp_group``: the TP group under ``--sequence-parallel`` (layouts padded to a multiple of its size)."""
    import torch.distributed as dist

    check_docs(docs, plan)
    device = device or torch.device("cpu")
    att, lin = plan.attention_layout[rank], plan.linear_layout[rank]
    sp = dist.get_world_size(sp_group) if sp_group is not None else 1
    if sp == 1:
        sp_group = None
    pad_att, pad_lin = pad_rows(sum(map(len, att)), sp), pad_rows(sum(map(len, lin)), sp)
    engine = engine_factory(plan, rank, group, softmax_scale, counters)
    positions = _pad(gather_positions(att), pad_att).view(1, -1).to(device)
    # max_seqlen = the longest document: megatron sizes its rotary table by it (layer.py indexes it)
    psp = ZeppelinPackedSeqParams(
        qkv_format="thd", max_seqlen_q=max(plan.lengths), max_seqlen_kv=max(plan.lengths), plan=plan, rank=rank, group=group,
        engine=engine, remap=tuple(att) != tuple(lin),
        max_position=max(plan.lengths), position_ids=positions, pad_attention=pad_att, pad_linear=pad_lin,
        sp_group=sp_group,
        segment_cu_seqlens=torch.tensor(cu_seqlens(att), dtype=torch.int32, device=device))
    labels = gather_tokens(docs, lin, shift=1)
    return RankBatch(tokens=_pad(gather_tokens(docs, att), pad_att).view(1, -1).to(device),
                     position_ids=positions,
                     labels=_pad(labels, pad_lin).view(1, -1).to(device),
                     packed_seq_params=psp, domain_tokens=int(sum(plan.lengths)), label_tokens=labels.numel())
