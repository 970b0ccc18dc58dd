"""The stock reference batch: one global micro-batch of documents as ordinary Megatron samples.

DP rank r takes documents r, r+DP, r+2DP, ...; each document is its own sample, padded to
``seq_length`` (here the longest document, ``--max-position-embeddings``) with loss mask 0, so the stock layer spec's causal attention sees exactly one
document per row (pad tokens come after the real ones and are never attended to). A rank with no
document gets one all-pad row. Summed over the ranks this trains the same tokens as Zeppelin's plan
of the same documents, so the per-token mean loss and the gradients must agree.

>>> import torch
>>> b = stock_rank_batch([torch.tensor([5, 6, 7, 8]), torch.tensor([9, 10, 11])], 1, 2, seq_length=4)
>>> b.tokens.tolist(), b.labels.tolist(), b.loss_mask.tolist(), b.label_tokens
([[9, 10, 0, 0]], [[10, 11, 0, 0]], [[1.0, 1.0, 0.0, 0.0]], 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class StockBatch:
    tokens: torch.Tensor        # [b, seq_length]
    position_ids: torch.Tensor  # [b, seq_length]
    labels: torch.Tensor        # [b, seq_length]
    loss_mask: torch.Tensor     # [b, seq_length] float
    label_tokens: int


def stock_rank_batch(docs: Sequence[torch.Tensor], rank: int, world: int, seq_length: int,
                     device=None) -> StockBatch:
    mine = list(docs[rank::world]) or [torch.zeros(1, dtype=torch.long)]
    b = len(mine)
    tokens = torch.zeros(b, seq_length, dtype=torch.long)
    labels = torch.zeros(b, seq_length, dtype=torch.long)
    mask = torch.zeros(b, seq_length)
    for i, d in enumerate(mine):
        n = d.numel() - 1  # a document of n+1 tokens trains n positions
        if n > seq_length:
            raise ValueError(f"a document trains {n} tokens, more than --seq-length {seq_length}")
        tokens[i, :n], labels[i, :n], mask[i, :n] = d[:-1], d[1:], 1.0
    pos = torch.arange(seq_length).unsqueeze(0).expand(b, -1).contiguous()
    device = device or torch.device("cpu")
    return StockBatch(tokens.to(device), pos.to(device), labels.to(device), mask.to(device), int(mask.sum().item()))
