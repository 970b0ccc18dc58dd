"""Varlen: the one description of a kernel call over many documents at once (THD layout).

Sequence i of a call is queries ``q[cu_q[i]:cu_q[i+1]]`` against keys ``k[cu_k[i]:cu_k[i+1]]``;
q is ``[total_q, heads, d]``, k/v ``[total_k, kv_heads, d]`` (GQA: query head j reads kv head
``j // (heads // kv_heads)``, Megatron's grouping). Every backend returns ``out [total_q, heads, d]``
and ``lse [total_q, heads]`` (float32; float64 for float64 input), and its backward takes the
*final* out and lse of the query rows (FlashAttention's trick: each call's gradient is then exact
on its own, so a ring can sum them).

``causal`` is bottom-right aligned, FlashAttention-2's and cuDNN's ``causal_bottom_right``
convention: query j of sequence i sees key m iff ``m <= j + (sk_i - sq_i)``. Every query must see
at least one key (``sk_i >= sq_i >= 1``), so no backend meets an empty softmax row (flash-attn
would report lse +inf there, cuDNN -inf): pieces.py never builds such a call.

>>> v = Varlen((3, 2), (5, 2), causal=True)
>>> v.cu_q, v.cu_k, v.max_q, v.max_k, v.total_q, v.total_k
((0, 3, 5), (0, 5, 7), 3, 5, 5, 7)
>>> Varlen((3,), (2,), causal=True)
Traceback (most recent call last):
...
megatron_zeppelin.attention.kernels.varlen.KernelError: causal sequence 0 has 3 queries but 2 keys: bottom-right causal needs keys >= queries
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import Dict, Tuple

import torch

from megatron_zeppelin.errors import ZeppelinError


class KernelError(ZeppelinError):
    pass


@dataclass(frozen=True)
class Varlen:
    seqlens_q: Tuple[int, ...]
    seqlens_k: Tuple[int, ...]
    causal: bool
    _cu: Dict = field(default_factory=dict, compare=False, repr=False)  # device -> int32 tensors

    def __post_init__(self):
        if len(self.seqlens_q) != len(self.seqlens_k):
            raise KernelError(f"{len(self.seqlens_q)} query sequences but {len(self.seqlens_k)} key sequences")
        for i, (a, b) in enumerate(zip(self.seqlens_q, self.seqlens_k)):
            if a < 1 or b < 1:
                raise KernelError(f"sequence {i} is empty ({a} queries, {b} keys): leave it out of the call")
            if self.causal and b < a:
                raise KernelError(f"causal sequence {i} has {a} queries but {b} keys: bottom-right causal "
                                  "needs keys >= queries")

    @property
    def cu_q(self) -> Tuple[int, ...]:
        return (0,) + tuple(accumulate(self.seqlens_q))

    @property
    def cu_k(self) -> Tuple[int, ...]:
        return (0,) + tuple(accumulate(self.seqlens_k))

    @property
    def max_q(self) -> int:
        return max(self.seqlens_q)

    @property
    def max_k(self) -> int:
        return max(self.seqlens_k)

    @property
    def total_q(self) -> int:
        return self.cu_q[-1]

    @property
    def total_k(self) -> int:
        return self.cu_k[-1]

    def cu_seqlens(self, device) -> Tuple[torch.Tensor, torch.Tensor]:
        """(cu_seqlens_q, cu_seqlens_k): int32, 1-D, on ``device`` (what every varlen kernel takes)."""
        key = str(device)
        if key not in self._cu:
            self._cu[key] = (torch.tensor(self.cu_q, dtype=torch.int32, device=device),
                             torch.tensor(self.cu_k, dtype=torch.int32, device=device))
        return self._cu[key]

    def check(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape:
            raise KernelError(f"varlen q/k/v must be [tokens, heads, d] with k and v alike; got "
                              f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        if q.shape[0] != self.total_q or k.shape[0] != self.total_k:
            raise KernelError(f"q has {q.shape[0]} rows and k {k.shape[0]}, but the call's cu_seqlens say "
                              f"{self.total_q} and {self.total_k}")
        if q.shape[2] != k.shape[2] or q.shape[1] % k.shape[1]:
            raise KernelError(f"q {tuple(q.shape[1:])} does not fit k/v {tuple(k.shape[1:])}: heads must be a "
                              "multiple of kv_heads and head_dim equal")
