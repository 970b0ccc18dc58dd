"""all_to_all_v: rows of ``[tokens, *]`` exchanged between all ranks of a group, differentiable.

``x`` holds the rows for group rank 0, then for rank 1, ... (``send_counts[j]`` rows for rank j); the
result holds the rows from rank 0, then from rank 1, ... (``recv_counts[j]`` from rank j). The
backward is the mirror exchange (counts swapped): an all-to-all-v is a permutation of rows across
ranks, so its adjoint is its inverse.

Any dtype: rows travel as raw bytes (uint8), so bf16, bool or complex work on every backend.
``method="p2p"`` (default) uses batched isend/irecv with only the pairs that exchange rows (a remap
touches few pairs), posted through p2p.P2PExchange (so ``ZEPPELIN_P2P_SEMANTICS=nccl`` checks them too); ``method="collective"`` uses ``all_to_all_single`` (every rank takes part).
``check=True`` all-gathers the counts first and raises on every rank if any pair disagrees.
Process groups are passed explicitly (``group=None`` is the default group).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.distributed.p2p import P2PExchange

METHODS = ("p2p", "collective")


class AllToAllError(ZeppelinError):
    """Misuse of all_to_all_v: counts that do not match the tensor, the group or the peers."""


def _counts(name: str, counts: Sequence[int], world: int) -> List[int]:
    out = [int(c) for c in counts]
    if len(out) != world or any(c < 0 for c in out) or any(int(c) != c for c in counts):
        raise AllToAllError(f"{name} must be {world} non-negative integers (one per group rank), got "
                            f"{list(counts)}")
    return out


def _exchange(x: torch.Tensor, send: List[int], recv: List[int], group, method: str) -> torch.Tensor:
    me = dist.get_rank(group)
    n_out = sum(recv)
    row = 1
    for s in x.shape[1:]:
        row *= s
    out = x.new_empty((n_out,) + tuple(x.shape[1:]))
    if row == 0 or (method == "p2p" and n_out == 0 and x.shape[0] == 0):
        return out  # nothing to move (a collective still needs every rank, so it goes on)
    # [n, *] -> [n, row * itemsize] bytes: the same bytes on every backend whatever the dtype.
    xb = x.contiguous().reshape(x.shape[0], row).view(torch.uint8)
    ob = out.view(out.shape[0], row).view(torch.uint8)
    if method == "collective":
        dist.all_to_all_single(ob, xb, output_split_sizes=recv, input_split_sizes=send, group=group)
        return out
    s_off = [0]
    for c in send:
        s_off.append(s_off[-1] + c)
    r_off = [0]
    for c in recv:
        r_off.append(r_off[-1] + c)
    ob[r_off[me]:r_off[me + 1]] = xb[s_off[me]:s_off[me + 1]]  # own rows: a local copy
    others = [j for j in range(len(send)) if j != me]  # group ranks: P2PExchange maps them to global ones
    sends = [(j, xb[s_off[j]:s_off[j + 1]], 0) for j in others if send[j]]
    recvs = [(j, ob[r_off[j]:r_off[j + 1]], 0) for j in others if recv[j]]
    if sends or recvs:
        P2PExchange(sends, recvs, group).start().wait()
    return out


def _row_bytes(x: torch.Tensor) -> int:
    n = x.element_size()
    for s in x.shape[1:]:
        n *= s
    return n


class _AllToAllV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send, recv, group, method, on_send):
        ctx.args = (send, recv, group, method, on_send)
        if on_send is not None:
            on_send(send, _row_bytes(x), "fwd")
        return _exchange(x, send, recv, group, method)

    @staticmethod
    def backward(ctx, grad):
        send, recv, group, method, on_send = ctx.args
        if on_send is not None:
            on_send(recv, _row_bytes(grad), "bwd")
        # The mirror exchange: rows go back where they came from.
        return _exchange(grad.contiguous(), recv, send, group, method), None, None, None, None, None


def _check_peers(send: List[int], recv: List[int], group) -> None:
    world, me = dist.get_world_size(group), dist.get_rank(group)
    mine = torch.tensor([send, recv], dtype=torch.int64)  # [2, world]
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine, group=group)
    for i in range(world):  # every rank checks every pair, so all raise together
        for j in range(world):
            s, r = int(everyone[i][0, j]), int(everyone[j][1, i])
            if s != r:
                raise AllToAllError(f"all_to_all_v: rank {i} sends {s} rows to rank {j}, which expects "
                                    f"{r} (rank {me} checked; the callers' counts disagree)")


def all_to_all_v(x: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int],
                 group: Optional[dist.ProcessGroup] = None, *, method: str = "p2p",
                 check: bool = False, on_send: Optional[Callable[[List[int], int, str], None]] = None
                 ) -> torch.Tensor:
    """Rows ``x[sum(send[:j]) : sum(send[:j+1])]`` go to group rank j; see the module docstring.
    ``on_send(rows_to_each_group_rank, bytes_per_row, "fwd" | "bwd")`` is called before each exchange
    this rank makes (the backward's too), for traffic counters."""
    if not dist.is_available() or not dist.is_initialized():
        raise AllToAllError("all_to_all_v needs torch.distributed initialised (init_process_group)")
    if method not in METHODS:
        raise AllToAllError(f"method must be one of {METHODS}, got {method!r}")
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise AllToAllError("all_to_all_v takes a tensor of rows [tokens, *] (at least 1-D)")
    world, me = dist.get_world_size(group), dist.get_rank(group)
    send = _counts("send_counts", send_counts, world)
    recv = _counts("recv_counts", recv_counts, world)
    if sum(send) != x.shape[0]:
        raise AllToAllError(f"send_counts sum to {sum(send)} but x has {x.shape[0]} rows")
    if send[me] != recv[me]:
        raise AllToAllError(f"rank {me} keeps {send[me]} of its rows but expects {recv[me]} from itself")
    if check:
        _check_peers(send, recv, group)
    return _AllToAllV.apply(x, send, recv, group, method, on_send)
