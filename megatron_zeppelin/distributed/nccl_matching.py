"""NCCL's point-to-point matching rules on gloo: a transport mode that makes tests prove NCCL safety.

Gloo pairs a send with the receive of the same peer and the same tag. NCCL ignores tags: on one
communicator (one process group), the k-th send a rank posts to a peer meets the k-th receive
that peer posts from it, whatever their tags. A program whose two ends post a peer pair's messages
in different orders (a relay thread forwarding a piece after its caller already posted the next
exchange, say) is correct on gloo and mis-delivers on NCCL: the data of one message lands in the
buffer of another, silently when their sizes agree.

With ``ZEPPELIN_P2P_SEMANTICS=nccl`` (``P2PSemantics.NCCL``; read at every posting, so the
launcher's ``env=`` or the shell sets it) every ``P2PExchange`` (hence ``send_recv``,
``ring_shift``, ``all_to_all_v`` and the schedule executor) posts by NCCL's rule:

- Each op gets the next *sequence number* of its (process group, peer, direction), in the order
  ops enter the group (under the posting lock of distributed/p2p.py): the posting order NCCL sees.
- On the wire the op's gloo tag is built from that number, not from the caller's tag, so gloo
  pairs the k-th send of a pair with its k-th receive: exactly NCCL's pairing, whatever the tags.
  The data every receive gets in this mode is the data NCCL would give it for the same posting
  order.
- Every message is preceded by a *header* (its own fixed-size message: the sequence number, the
  caller's tag, dtype, shape, sender), and the receiver checks it against its own op before it
  touches the payload. A differing shape, dtype or tag raises ``MatchError`` naming both ops (op,
  peer, tag, shape, dtype of the sender's and the receiver's). A differing tag raises too: the
  program meant another message, and on NCCL it would have been delivered here anyway.
- The payload's gloo tag also carries a hash of its byte count: gloo aborts the whole process when
  a message is larger than the buffer that receives it ("Received data size doesn't match expected
  size", in its IO thread, past any try), so messages of different sizes never meet on the wire;
  the header raises first, with the names.

So a test whose data is checked and that passes in this mode shows that every receive met the send
the program meant under NCCL's pairing, for the posting order of that run. The executor fixes each
rank's posting order by the layer program, not by thread timing (distributed/executor.py), so that
order is the only one: tests/multiproc/test_p2p.py forces the adverse timing and checks it.

Not modelled: NCCL runs a communicator's operations one after the other on its stream, and a
rank's batch completes as a whole; here each op completes on its own, as on gloo.

>>> wire_tags(seq=3, nbytes=64) == wire_tags(seq=3 + SEQ_WRAP, nbytes=64)
True
>>> wire_tags(3, 64)[1] != wire_tags(3, 72)[1]   # sizes differ: the payloads never meet
True
>>> describe("isend", 1, 5, 262150, (2, 4), torch.float64, seq=0)   # rank 1's first send to rank 5
'rank 1: isend #0 to rank 5 (tag 262150, shape (2, 4), torch.float64)'
"""

from __future__ import annotations

import os
import weakref
import zlib
from enum import Enum
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from megatron_zeppelin.errors import ZeppelinError

ENV = "ZEPPELIN_P2P_SEMANTICS"


class P2PSemantics(str, Enum):
    """How a receive finds its send: ``tags`` gloo's (peer and tag), ``nccl`` NCCL's (posting order
    per peer pair, tags ignored, sizes and dtypes checked)."""
    TAGS = "tags"
    NCCL = "nccl"


class MatchError(ZeppelinError):
    """Under NCCL's matching a receive met a send it was not meant for (names both ops)."""


def semantics() -> P2PSemantics:
    """The mode the environment asks for (``ZEPPELIN_P2P_SEMANTICS``, default ``tags``)."""
    v = os.environ.get(ENV, "").strip().lower() or P2PSemantics.TAGS.value
    try:
        return P2PSemantics(v)
    except ValueError:
        raise ZeppelinError(f"{ENV}={v!r} is not one of {[s.value for s in P2PSemantics]}: set {ENV}=nccl "
                            "(NCCL's matching rules on gloo) or unset it") from None


# --- wire tags -------------------------------------------------------------------------------------
SEQ_BITS, SIZE_BITS = 15, 14  # gloo tags are int32: bit 30 marks this mode, then seq | payload | size
SEQ_WRAP = 1 << SEQ_BITS  # more than this many messages of one pair in flight at once would collide
_BASE = 1 << (SEQ_BITS + 1 + SIZE_BITS)


def wire_tags(seq: int, nbytes: int) -> Tuple[int, int]:
    """(header tag, payload tag) of the ``seq``-th message of a pair carrying ``nbytes``."""
    s = (seq % SEQ_WRAP) << (1 + SIZE_BITS)
    size = zlib.crc32(int(nbytes).to_bytes(8, "little")) & ((1 << SIZE_BITS) - 1)
    return _BASE | s, _BASE | s | (1 << SIZE_BITS) | size


# --- headers ---------------------------------------------------------------------------------------
_MAGIC = 0x5A504E43  # "ZPNC"
_DIMS = 8
_HEADER = 8 + _DIMS  # magic, seq, tag, dtype, ndim, numel, sender, nbytes, shape[:_DIMS]
_DTYPES = tuple(d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
                            torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
                            getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None))
                if d is not None)


def _dtype_code(dt: torch.dtype) -> int:
    return _DTYPES.index(dt) if dt in _DTYPES else len(_DTYPES)


def _dtype_name(code: int) -> str:
    return str(_DTYPES[code]) if 0 <= code < len(_DTYPES) else "another dtype"


def _header(seq: int, tag: int, t: torch.Tensor, sender: int) -> torch.Tensor:
    shape = list(t.shape)[:_DIMS]
    vals = [_MAGIC, seq, tag, _dtype_code(t.dtype), t.dim(), t.numel(), sender, t.numel() * t.element_size()]
    return torch.tensor(vals + shape + [0] * (_DIMS - len(shape)), dtype=torch.int64, device=t.device)


def describe(op: str, rank: int, peer: int, tag: int, shape, dtype, seq: Optional[int] = None) -> str:
    """One op as the error names it: who, which op of the pair, its peer, tag, shape and dtype."""
    to = "to" if op == "isend" else "from"
    n = "" if seq is None else f" #{seq}"
    return f"rank {rank}: {op}{n} {to} rank {peer} (tag {tag}, shape {tuple(shape)}, {dtype})"


# --- sequence numbers per (group, peer, direction) ---------------------------------------------------
_counters: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # group -> {(op, peer): next seq}


def _group_obj(group):
    return group if group is not None else dist.group.WORLD


def _next(group, op: str, peer: int) -> int:
    """The next sequence number of (group, op, peer). Called under p2p's posting lock: the number is
    the order in which ops entered the group, as NCCL's communicator sees them."""
    g = _group_obj(group)
    per = _counters.setdefault(g, {})
    seq = per.get((op, peer), 0)
    per[(op, peer)] = seq + 1
    return seq


class Posted:
    """One op posted under NCCL's matching: its header and payload requests; ``wait()`` waits
    both, a receive checking the header first."""

    def __init__(self, op: str, me: int, peer: int, tag: int, tensor: torch.Tensor, seq: int, header: torch.Tensor,
                 group_name: str):
        self.op, self.me, self.peer, self.tag, self.tensor, self.seq = op, me, peer, tag, tensor, seq
        self.header, self.group_name = header, group_name
        self.works: List[object] = []

    def mine(self) -> str:
        return describe(self.op, self.me, self.peer, self.tag, self.tensor.shape, self.tensor.dtype, self.seq)

    def wait(self) -> None:
        hw, pw = self.works
        hw.wait()
        if self.op == "irecv":
            self._check()
        pw.wait()

    def _check(self) -> None:
        h = self.header.cpu().tolist()
        magic, seq, tag, code, ndim, numel, sender, _nbytes = h[:8]
        shape = tuple(h[8:8 + min(ndim, _DIMS)]) + (("...",) if ndim > _DIMS else ())
        t = self.tensor
        got_shape = tuple(t.shape)[:_DIMS] + (("...",) if t.dim() > _DIMS else ())
        diff = []
        if magic != _MAGIC or seq % SEQ_WRAP != self.seq % SEQ_WRAP or sender != self.peer:
            diff.append("sequence")  # the wire tags make this impossible unless another sender used them
        if tag != self.tag:
            diff.append("tag")
        if code != _dtype_code(t.dtype):
            diff.append("dtype")
        if ndim != t.dim() or numel != t.numel() or shape != got_shape:
            diff.append("shape")
        if not diff:
            return
        theirs = describe("isend", sender, self.me, tag, shape, _dtype_name(code), seq)
        raise MatchError(
            f"NCCL matching ({ENV}=nccl) on group {self.group_name}: {self.mine()} meets {theirs}, which "
            f"differs in {', '.join(diff)}. NCCL pairs a peer pair's k-th send with its k-th receive on one "
            "communicator and ignores tags: the two ranks posted this pair's messages in different orders")


def post(sends: Sequence[Tuple[int, torch.Tensor, int]], recvs: Sequence[Tuple[int, torch.Tensor, int]],
         group) -> List[Posted]:
    """Post ``sends`` then ``recvs`` ((peer as a global rank, tensor, caller's tag); tensors
    contiguous) by NCCL's pairing; one ``Posted`` per op in that order. The caller holds the
    posting lock, so the sequence numbers follow the order ops enter the group."""
    if not sends and not recvs:
        return []
    g = _group_obj(group)
    me = dist.get_rank()
    name = getattr(g, "group_name", "") or "WORLD"
    posted, ops = [], []
    for op, items in (("isend", sends), ("irecv", recvs)):
        fn = dist.isend if op == "isend" else dist.irecv
        for peer, t, tag in items:
            seq = _next(g, op, peer)
            nbytes = t.numel() * t.element_size()
            htag, ptag = wire_tags(seq, nbytes)
            header = _header(seq, tag, t, me) if op == "isend" else torch.empty(_HEADER, dtype=torch.int64,
                                                                                  device=t.device)
            p = Posted(op, me, peer, tag, t, seq, header, name)
            ops += [dist.P2POp(fn, header, peer, group, htag), dist.P2POp(fn, t, peer, group, ptag)]
            posted.append(p)
    works = dist.batch_isend_irecv(ops) if ops else []
    for i, p in enumerate(posted):
        p.works = works[2 * i:2 * i + 2]
    return posted


def counters_of(group) -> Dict[Tuple[str, int], int]:
    """This rank's sequence counters of ``group`` (ops posted so far per (op, peer)): for tests."""
    return dict(_counters.get(_group_obj(group), {}))
