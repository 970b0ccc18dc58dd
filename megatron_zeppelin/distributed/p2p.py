"""Batched point-to-point communication: a start()/wait() handle and an autograd send/recv.

``P2PExchange`` posts a list of isend/irecv as one ``batch_isend_irecv`` on a process group (peers
are group ranks) and is guarded against misuse: wait() before start(), start() twice and wait()
twice raise CommError instead of hanging or silently returning garbage.

Posting is serialised by one process-wide lock (``_POST_LOCK``): routed exchanges post their later
stages from background threads (distributed/executor.py), and NCCL's batch_isend_irecv coalesces
through per-group state that two threads must not interleave. Gloo's send/recv run on the calling
thread with explicit tags (ProcessGroupGloo.hpp: "completed by the device thread", no per-call
sequence to match), so waiting outside the lock is safe; tags keep concurrent exchanges apart.
With ``ZEPPELIN_P2P_SEMANTICS=nccl`` the exchange posts by NCCL's rules instead (nccl_matching.py:
a receive meets the oldest unmatched send of its peer pair whatever the tags, and a receive that
meets a send of another tag, shape or dtype raises naming both).

``send_recv`` is the autograd Function: sends tensors to peers and returns the tensors received;
its backward is the mirror (gradients of what was received go back to the senders, and the
gradients of what was sent come back). ``ring_shift`` is its ring special case. Every rank of the
exchange must call it with matching sends/recvs (same tags), otherwise the wait times out.
"""

from __future__ import annotations

import threading
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.distributed import nccl_matching


class CommError(ZeppelinError):
    """Misuse of a communication handle or primitive."""


_POST_LOCK = threading.Lock()
DEFAULT_TIMEOUT_S = 1800.0  # torch's default for non-NCCL groups


def group_timeout_s(group) -> float:
    """The group's collective timeout in seconds (its backend's option), else torch's default."""
    if group is None and not dist.is_initialized():
        return DEFAULT_TIMEOUT_S
    try:
        g = group if group is not None else dist.group.WORLD
        dev = torch.device("cuda") if torch.device("cuda") in g._device_types else torch.device("cpu")
        return float(g._get_backend(dev).options._timeout.total_seconds())
    except (AttributeError, RuntimeError, ValueError):
        return DEFAULT_TIMEOUT_S


def global_rank(group, group_rank: int) -> int:
    if group is None or group is dist.group.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)


class P2PExchange:
    """sends: [(peer, tensor, tag)], recvs: [(peer, buffer, tag)] with group-rank peers."""

    def __init__(self, sends: Sequence[Tuple[int, torch.Tensor, int]],
                 recvs: Sequence[Tuple[int, torch.Tensor, int]], group=None):
        self.sends, self.recvs, self.group = list(sends), list(recvs), group
        self._reqs: Optional[list] = None
        self._waited: set = set()
        self._state = "new"

    def start(self) -> "P2PExchange":
        if self._state != "new":
            raise CommError(f"P2PExchange.start() called twice (state {self._state})")
        sends = [(global_rank(self.group, p), t.contiguous(), tag) for p, t, tag in self.sends]
        recvs = [(global_rank(self.group, p), b, tag) for p, b, tag in self.recvs]
        self._keep = sends  # contiguous send copies must outlive the requests
        mode = nccl_matching.semantics()
        with _POST_LOCK:  # one batch at a time per process (NCCL coalescing state is per group)
            if mode is nccl_matching.P2PSemantics.NCCL:  # sequence numbers follow this lock's order
                self._reqs = nccl_matching.post(sends, recvs, self.group)
            else:
                ops = [dist.P2POp(dist.isend, t, p, self.group, tag) for p, t, tag in sends]
                ops += [dist.P2POp(dist.irecv, b, p, self.group, tag) for p, b, tag in recvs]
                self._reqs = dist.batch_isend_irecv(ops) if ops else []
        self._state = "started"
        return self

    def wait(self) -> List[torch.Tensor]:
        if self._state == "new":
            raise CommError("P2PExchange.wait() called before start()")
        if self._state == "done":
            raise CommError("P2PExchange.wait() called twice")
        for j in range(len(self._reqs)):
            self.wait_one(j)
        self._state, self._keep = "done", None
        return [b for _, b, _ in self.recvs]

    def wait_one(self, j: int) -> None:
        """Wait for request j (sends first, then recvs) once: a gloo request waited twice blocks."""
        if self._state == "new":
            raise CommError("P2PExchange.wait_one() called before start()")
        if j not in self._waited:
            self._reqs[j].wait()
            self._waited.add(j)


def _tags(peers: Sequence[int], base: int) -> List[int]:
    """k-th message to (or from) the same peer gets tag base + k: both sides count the same way."""
    seen: dict = {}
    out = []
    for p in peers:
        out.append(base + seen.get(p, 0))
        seen[p] = seen.get(p, 0) + 1
    return out


class _SendRecv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, meta, *sends):
        send_peers, recv_specs, group, tag = meta[:4]
        ctx.meta = meta
        ctx.send_shapes = [s.shape for s in sends]
        dtype, device = meta[4], meta[5]
        bufs = [torch.empty(shape, dtype=dtype, device=device) for _, shape in recv_specs]
        ex = P2PExchange(list(zip(send_peers, sends, _tags(send_peers, tag))),
                         list(zip([p for p, _ in recv_specs], bufs, _tags([p for p, _ in recv_specs], tag))), group)
        return tuple(ex.start().wait())

    @staticmethod
    def backward(ctx, *grads):
        send_peers, recv_specs, group, tag, dtype, device = ctx.meta
        # mirror: what was received goes back (tag of the received message), what was sent comes back
        bufs = [torch.empty(shape, dtype=dtype, device=device) for shape in ctx.send_shapes]
        rpeers = [p for p, _ in recv_specs]
        gs = [g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
              for (_, shape), g in zip(recv_specs, grads)]
        ex = P2PExchange(list(zip(rpeers, gs, _tags(rpeers, tag))),
                         list(zip(send_peers, bufs, _tags(send_peers, tag))), group)
        return (None, *ex.start().wait())


def send_recv(sends: Sequence[Tuple[int, torch.Tensor]], recvs: Sequence[Tuple[int, Sequence[int]]],
              group=None, *, dtype=None, device=None, tag: int = 0) -> Tuple[torch.Tensor, ...]:
    """Differentiable batched exchange. ``sends``: [(peer, tensor)]; ``recvs``: [(peer, shape)].
    The k-th send to a peer matches that peer's k-th recv from this rank (tag + k)."""
    if not sends and not recvs:
        return ()
    ref = sends[0][1] if sends else None
    dtype = dtype or (ref.dtype if ref is not None else torch.get_default_dtype())
    device = device or (ref.device if ref is not None else torch.device("cpu"))
    meta = ([p for p, _ in sends], [(p, tuple(s)) for p, s in recvs], group, tag, dtype, device)
    return _SendRecv.apply(meta, *[t for _, t in sends])


def ring_shift(x: torch.Tensor, ranks: Sequence[int], rank: int, group=None,
               recv_shape: Optional[Sequence[int]] = None, tag: int = 0) -> torch.Tensor:
    """Member i of ``ranks`` sends ``x`` to member i+1 and returns what member i-1 sent
    (shape ``recv_shape``, default x's). Differentiable: the backward shifts gradients back."""
    if rank not in ranks:
        raise CommError(f"rank {rank} is not a member of ring {tuple(ranks)}")
    g = len(ranks)
    if g == 1:
        return x.clone()
    i = list(ranks).index(rank)
    (y,) = send_recv([(ranks[(i + 1) % g], x)], [(ranks[(i - 1) % g], recv_shape or x.shape)], group, tag=tag)
    return y
