"""LSE merge: combine partial attention results over disjoint key sets into the exact result.

If block A gives (o_a, l_a) and block B gives (o_b, l_b) for the same query rows, attention over
both key sets is  l = log(e^l_a + e^l_b),  o = o_a e^(l_a - l) + o_b e^(l_b - l).  A row with
l = -inf saw no key and contributes nothing (two such rows stay -inf with output 0, never NaN).

>>> import torch
>>> o, l = merge(torch.tensor([[[1.0]]]), torch.tensor([[0.0]]), torch.tensor([[[3.0]]]), torch.tensor([[0.0]]))
>>> o.flatten().tolist(), round(l.item(), 4)   # equal weights: the mean; lse = log 2
([2.0], 0.6931)
>>> o, l = merge(torch.zeros(1, 1, 1), torch.full((1, 1), -float("inf")), torch.ones(1, 1, 1), torch.full((1, 1), -float("inf")))
>>> o.flatten().tolist(), l.item()
([0.0], -inf)
"""

from __future__ import annotations

from typing import Tuple

import torch


def merge(o_a: torch.Tensor, l_a: torch.Tensor, o_b: torch.Tensor, l_b: torch.Tensor
          ) -> Tuple[torch.Tensor, torch.Tensor]:
    """o: [s, h, d], l: [s, h] (l may be float32 while o is lower precision)."""
    lse = torch.logaddexp(l_a, l_b)
    safe = torch.where(torch.isinf(lse) & (lse < 0), torch.zeros_like(lse), lse)  # all -inf rows
    wa = torch.exp(l_a - safe).unsqueeze(-1).to(o_a.dtype)
    wb = torch.exp(l_b - safe).unsqueeze(-1).to(o_b.dtype)
    return o_a * wa + o_b * wb, lse


def merge_rows(acc_o: torch.Tensor, acc_l: torch.Tensor, rows, o: torch.Tensor, l: torch.Tensor,
               unique: bool = False) -> None:
    """Merge partial results (o [n, h, d], l [n, h]) into the accumulator rows ``rows`` in place:
    a slice, or an index tensor in which a row may repeat (each occurrence is one more key set);
    ``unique``: the caller knows no row repeats (no torch.unique, which syncs a GPU)."""
    if unique and not isinstance(rows, slice):
        mo, ml = merge(acc_o[rows], acc_l[rows], o.to(acc_o.dtype), l.to(acc_l.dtype))
        acc_o[rows], acc_l[rows] = mo, ml
        return
    if isinstance(rows, slice):
        mo, ml = merge(acc_o[rows], acc_l[rows], o.to(acc_o.dtype), l.to(acc_l.dtype))
        acc_o[rows], acc_l[rows] = mo, ml
        return
    u, inv = torch.unique(rows, return_inverse=True)
    so, sl = acc_o[u], acc_l[u]
    l = l.to(sl.dtype)
    m = sl.index_reduce(0, inv, l, "amax", include_self=True)  # running max per row
    safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # rows that saw no key yet
    w_old, w_new = torch.exp(sl - safe), torch.exp(l - safe[inv])
    num = (so * w_old.unsqueeze(-1).to(so.dtype)).index_add_(0, inv, o.to(so.dtype) * w_new.unsqueeze(-1).to(so.dtype))
    den = w_old.index_add(0, inv, w_new)
    seen = den > 0
    den1 = torch.where(seen, den, torch.ones_like(den))
    acc_o[u] = torch.where(seen.unsqueeze(-1), num / den1.unsqueeze(-1).to(so.dtype), so)
    acc_l[u] = torch.where(seen, safe + torch.log(den1), sl)
