"""The schedule executor: runs the CommOps of one (queue, step) of a Plan on this rank.

A message is the block of token rows that ring member ``block`` owns, travelling from ``msg_src`` to
``msg_dst``; each op moves its rows [start, stop) from ``src`` to ``dst``. Stages run in STAGES order
(direct; dispatch -> transfer -> combine), one ``batch_isend_irecv`` per stage on the domain group. A
rank that is neither source nor destination (a proxy of a routed message) keeps the rows it
received in one stage and forwards them in a later one; ``msg_dst`` reassembles the whole message.
The same ops run ``reverse=True`` carry a message back (dst -> src, stages in reverse order): the
transpose of the forward map, used for gradients going home.

Every rank of the domain must build its StepExchanges from the same op lists in the same order (the
ops come from the Plan, which all ranks share): stages are then matched and cannot deadlock.

Worked example (no communication needed): one direct op of 2 rows from rank 0 to itself.

>>> import torch
>>> from megatron_zeppelin.planner.types import CommOp
>>> op = CommOp("intra", 0, 0, 0, 0, 0, 0, 0, 0, 2, 8, "nvlink", -1, "direct")
>>> ex = StepExchange([op], rank=0, group=None, payload={(0, 0): torch.arange(4.).view(2, 2)}, width=2)
>>> ex.start().wait()[(0, 0, 0)].tolist()
[[0.0, 1.0], [2.0, 3.0]]
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..planner.types import STAGES, CommOp
from .counters import CommCounters
from .p2p import CommError, P2PExchange

Key = Tuple[int, int, int, int]  # (ring, block, msg_src, msg_dst)


def mirror(op: CommOp) -> CommOp:
    """The op carrying the same rows the other way (gradients going home)."""
    return replace(op, src=op.dst, dst=op.src, msg_src=op.msg_dst, msg_dst=op.msg_src)


class StepExchange:
    """Executes ``ops`` (all ops of one (queue, step) that are active, identical on every rank).

    payload: messages this rank originates, keyed (ring, block, msg_dst) or (ring, block), each a
    ``[rows, width]`` tensor. ``width``: channels per row, an int or ``f(ring) -> int``.
    wait() returns the messages that end here, keyed (ring, block, msg_src).
    start() posts the first stage, so compute can overlap it; wait() finishes that stage and runs
    the later (routed) stages, which depend on it.
    """

    def __init__(self, ops: Sequence[CommOp], rank: int, group, payload: Dict[tuple, torch.Tensor],
                 width: Union[int, Callable[[int], int]], *, dtype: Optional[torch.dtype] = None,
                 device=None, reverse: bool = False, counters: Optional[CommCounters] = None,
                 phase: str = "fwd", tag: int = 0):
        ops = [mirror(o) for o in ops] if reverse else list(ops)
        self.ops = ops
        self.rank, self.group, self.payload = rank, group, payload
        self.width = width if callable(width) else (lambda _r, w=width: w)
        ref = next(iter(payload.values()), None)
        self.dtype = dtype or (ref.dtype if ref is not None else torch.get_default_dtype())
        self.device = device or (ref.device if ref is not None else torch.device("cpu"))
        self.counters, self.phase = counters, phase
        stages = tuple(reversed(STAGES)) if reverse else STAGES
        # (index, op) per stage, over all ops (the index is the op's tag: the same on both sides)
        self._stages: List[List[Tuple[int, CommOp]]] = [
            [(i, o) for i, o in enumerate(ops) if o.stage == st] for st in stages]
        self._stages = [s for s in self._stages if s]
        self._tag = tag << 20
        self._pieces: Dict[Key, List[Tuple[int, int, torch.Tensor]]] = {}
        self._done: Dict[Tuple[int, int, int], torch.Tensor] = {}
        self._rows: Dict[Key, int] = {}
        for o in ops:
            k = (o.ring, o.block, o.msg_src, o.msg_dst)
            self._rows[k] = max(self._rows.get(k, 0), o.stop)
        self._next = 0
        self._inflight: Optional[Tuple[P2PExchange, list]] = None
        self._state = "new"

    # --- data lookup ----------------------------------------------------------------------
    def _rows_of(self, o: CommOp) -> torch.Tensor:
        k = (o.ring, o.block, o.msg_src, o.msg_dst)
        if o.src == o.msg_src:
            t = self.payload.get((o.ring, o.block, o.msg_dst))
            if t is None:
                t = self.payload.get((o.ring, o.block))
            if t is None:
                raise CommError(f"rank {self.rank} must send block {o.block} of ring {o.ring} "
                                f"(step {o.step}) but holds no such message")
            return t[o.start:o.stop]
        for a, b, t in self._pieces.get(k, ()):
            if a <= o.start and o.stop <= b:
                return t[o.start - a:o.stop - a]
        raise CommError(f"rank {self.rank} must forward rows [{o.start}, {o.stop}) of ring {o.ring} "
                        f"block {o.block} in stage {o.stage} but never received them: the schedule's "
                        "stages are out of order")

    def _deliver(self, o: CommOp, rows: torch.Tensor) -> None:
        k = (o.ring, o.block, o.msg_src, o.msg_dst)
        if o.dst == o.msg_dst:
            dk = (o.ring, o.block, o.msg_src)
            if dk not in self._done:
                self._done[dk] = torch.empty((self._rows[k], self.width(o.ring)), dtype=self.dtype,
                                             device=self.device)
            self._done[dk][o.start:o.stop] = rows  # reassemble: rows land at their offsets
        else:
            self._pieces.setdefault(k, []).append((o.start, o.stop, rows))

    # --- stages ---------------------------------------------------------------------------
    def _post(self, stage: List[Tuple[int, CommOp]]) -> None:
        sends, recvs, landing = [], [], []
        for i, o in stage:
            if o.src == self.rank and o.dst == self.rank:
                landing.append((o, self._rows_of(o).clone()))  # self-hop: no message
            elif o.src == self.rank:
                data = self._rows_of(o)
                sends.append((o.dst, data, self._tag + i))
                if self.counters is not None:
                    nb = data.numel() * data.element_size()
                    self.counters.add_bytes(o.link, o.nic, nb, (self.phase, o.queue, o.step), rows=o.stop - o.start)
            elif o.dst == self.rank:
                buf = torch.empty((o.stop - o.start, self.width(o.ring)), dtype=self.dtype, device=self.device)
                recvs.append((o.src, buf, self._tag + i))
                landing.append((o, buf))
        ex = P2PExchange(sends, recvs, self.group).start()
        self._inflight = (ex, landing)

    def _finish(self) -> None:
        ex, landing = self._inflight
        ex.wait()
        for o, rows in landing:
            self._deliver(o, rows)
        self._inflight = None

    def start(self) -> "StepExchange":
        if self._state != "new":
            raise CommError(f"StepExchange.start() called twice (state {self._state})")
        self._state = "started"
        if self._stages:
            self._post(self._stages[0])
            self._next = 1
        return self

    def wait(self) -> Dict[Tuple[int, int, int], torch.Tensor]:
        if self._state == "new":
            raise CommError("StepExchange.wait() called before start()")
        if self._state == "done":
            raise CommError("StepExchange.wait() called twice")
        if self._inflight is not None:
            self._finish()
        while self._next < len(self._stages):
            self._post(self._stages[self._next])
            self._next += 1
            self._finish()
        self._state = "done"
        return self._done
