"""Attention kernels behind one varlen interface, and the engine's entry points.

The engine hands one (queue, step)'s work as *pairs* (query rows, key rows, causal_offset) of its
token-major tensors (q ``[t, heads, d]``, k/v ``[t, kv_heads, d]``); ``attend_blocks`` runs the pairs of
every ring of the step, each ring's K/V message its own tensor, as ONE varlen kernel call (pieces.py:
one cu_seqlens set; a second, full, call only for pair sets no engine step makes) and merges into
(out, lse) by LSE; ``attend_blocks_backward`` adds the gradients given the *final* out and lse.
``attend_pairs`` is the one-tensor case (the local queue). ``block_forward``/``block_backward`` are the same
for one pair (calibration, tests). The kernel is a ``Kernel`` (``--zeppelin-attention-kernel`` and
``--transformer-impl``; select.py) or its name.

>>> import torch
>>> q = torch.randn(3, 2, 4, dtype=torch.float64); kv = torch.randn(3, 1, 4, dtype=torch.float64)
>>> o1, l1 = block_forward(q, kv, kv, 0.5, causal_offset=0, backend="cpu_flash")
>>> o2, l2 = block_forward(q, kv, kv, 0.5, causal_offset=0, backend="reference")
>>> o1.shape, l1.shape, bool(torch.allclose(o1, o2) and torch.allclose(l1, l2))
(torch.Size([3, 2, 4]), torch.Size([3, 2]), True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import torch

from megatron_zeppelin.attention.kernels import select
from megatron_zeppelin.attention.kernels.pieces import Pair, blocks_backward, blocks_forward, plan_calls, split_pair
from megatron_zeppelin.attention.kernels.select import BACKENDS, resolve
from megatron_zeppelin.attention.kernels.varlen import KernelError, Varlen
from megatron_zeppelin.spec.words import KernelBackend

__all__ = ["BACKENDS", "Kernel", "KernelError", "Pair", "Varlen", "attend_blocks", "attend_blocks_backward",
           "attend_pairs", "attend_pairs_backward",
           "block_backward", "block_forward", "plan_calls", "resolve", "segment_mask", "split_pair",
           "varlen_backward", "varlen_forward"]


@dataclass(frozen=True)
class Kernel:
    """The run's kernel choice: ``--zeppelin-attention-kernel`` and Megatron's ``--transformer-impl``."""
    name: KernelBackend = KernelBackend.AUTO
    transformer_impl: Optional[str] = None

    def __post_init__(self):
        if self.name not in BACKENDS:
            resolve(self.name, torch.device("cpu"), torch.float32)  # raises, naming the flag
        object.__setattr__(self, "name", KernelBackend(self.name))  # a member, from the flag's word

    def resolve(self, device: torch.device, dtype: torch.dtype) -> KernelBackend:
        return resolve(self.name, device, dtype, self.transformer_impl)


def _backend(kernel: Union[str, Kernel], q: torch.Tensor) -> str:
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    return k.resolve(q.device, q.dtype)


def varlen_forward(q, k, v, spec: Varlen, scale: float, backend: Union[str, Kernel] = "auto"):
    """One varlen call: (out [total_q, h, d], lse [total_q, h] float32/float64)."""
    return select.forward(_backend(backend, q), q, k, v, spec, scale)


def varlen_backward(dout, q, k, v, out, lse, spec: Varlen, scale: float, backend: Union[str, Kernel] = "auto"):
    """(dq, dk, dv) of one varlen call from the final out and lse of its query rows."""
    return select.backward(_backend(backend, q), dout, q, k, v, out, lse, spec, scale)


def attend_pairs(q, k, v, pairs: Sequence[Pair], out, lse, scale: float, backend: Union[str, Kernel] = "auto") -> None:
    """Merge the attention of ``pairs`` into the accumulators out [t, h, d], lse [t, h] in place."""
    attend_blocks(q, [(k, v, pairs)], out, lse, scale, backend)


def attend_pairs_backward(dout, q, k, v, out, lse, pairs: Sequence[Pair], dq, dk, dv, scale: float,
                          backend: Union[str, Kernel] = "auto") -> None:
    """Add the gradients of ``pairs`` into dq, dk, dv (out/lse: the final result of the query rows)."""
    attend_blocks_backward(dout, q, out, lse, dq, [(k, v, dk, dv, pairs)], scale, backend)


def attend_blocks(q, blocks, out, lse, scale: float, backend: Union[str, Kernel] = "auto") -> None:
    """The pairs of several K/V tensors at once: ``blocks`` = [(k, v, pairs)] (every ring of a queue
    step), one kernel call (pieces.plan_calls)."""
    blocks = [b for b in blocks if b[2] and b[0].shape[0]]
    if blocks and q.shape[0]:
        be = _backend(backend, q)
        blocks_forward(lambda *a: select.forward(be, *a), q, blocks, out, lse, scale)


def attend_blocks_backward(dout, q, out, lse, dq, blocks, scale: float, backend: Union[str, Kernel] = "auto") -> None:
    """Gradients of ``attend_blocks``: ``blocks`` = [(k, v, dk, dv, pairs)]."""
    blocks = [b for b in blocks if b[4] and b[0].shape[0]]
    if blocks and q.shape[0]:
        be = _backend(backend, q)
        blocks_backward(lambda *a: select.backward(be, *a), dout, q, out, lse, dq, blocks, scale)


def _acc(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                  causal_offset: Optional[int] = None, backend: Union[str, Kernel] = "auto"
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention of one block: (out [sq, h, d], lse [sq, h]). A query row that sees no key gets
    out 0 and lse -inf (merge.py treats that as 'no contribution')."""
    out = torch.zeros(q.shape, dtype=_acc(q.dtype), device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=_acc(q.dtype), device=q.device)
    attend_pairs(q, k, v, [(slice(0, q.shape[0]), slice(0, k.shape[0]), causal_offset)], out, lse, scale, backend)
    return out.to(q.dtype), lse


def block_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, scale: float,
                   causal_offset: Optional[int] = None, backend: Union[str, Kernel] = "auto"
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This block's share of (dq, dk, dv), given the *final* merged out and lse of the query rows."""
    acc = _acc(q.dtype)
    dq, dk, dv = (torch.zeros(x.shape, dtype=acc, device=x.device) for x in (q, k, v))
    attend_pairs_backward(dout, q, k, v, out, lse, [(slice(0, q.shape[0]), slice(0, k.shape[0]), causal_offset)],
                          dq, dk, dv, scale, backend)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def segment_mask(q_start: int, q_stop: int, k_start: int, k_stop: int) -> Tuple[bool, Optional[int]]:
    """(run?, causal_offset) for query positions [q_start, q_stop) against key positions
    [k_start, k_stop) of the same document under causal attention.

    >>> segment_mask(4, 6, 0, 2), segment_mask(2, 4, 2, 4), segment_mask(0, 2, 4, 6), segment_mask(2, 5, 0, 4)
    ((True, None), (True, 0), (False, None), (True, 2))
    """
    if q_stop <= q_start or k_stop <= k_start or k_start >= q_stop:
        return False, None
    if k_stop - 1 <= q_start:
        return True, None  # every key at or before the first query: full block
    return True, q_start - k_start
