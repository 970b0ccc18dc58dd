"""The schedule executor: runs the CommOps of one (queue, step) of a Plan on this rank.

A message is the block of token rows that ring member ``block`` owns, travelling from ``msg_src`` to
``msg_dst``; each op moves its rows [start, stop) from ``src`` to ``dst``. A routed message's piece
goes dispatch -> transfer -> combine through proxies (ranks that are neither source nor destination):
a proxy keeps the rows it received and forwards them in the next stage; ``msg_dst`` reassembles the
whole message. The same ops run ``reverse=True`` carry a message back (dst -> src, stages in reverse
order): the transpose of the forward map, used for gradients going home.

Progress (each piece as soon as its data is there, independent of the caller's compute, as NCCL's
communication stream does on GPUs; planner/cost/predict.py times exactly this): start() posts, on the
caller's thread, every receive of this rank and every send of the messages it originates. A relay
thread (one per exchange that has any) then forwards each piece the moment it has arrived, in the
program's order (planner/program.py ``step_order``: phases dispatch, transfer, combine, reversed
for ``reverse``; a routed piece cut into chunks runs as a pipeline, so a proxy forwards chunk i
while chunk i+1 is still being dispatched to it). wait() returns once this rank's own messages are done (its sends left, the messages
ending here assembled): a pure proxy does not wait for the pieces it relays. On CUDA the relay
runs on a side stream; wait() joins it only when a relayed piece ends on this rank, and then
orders the caller's stream after the relay's copies.

Posting order (NCCL pairs a peer pair's sends and receives in posting order and ignores tags;
distributed/nccl_matching.py checks it on gloo): each rank posts its sends on the group in the
program's order, whatever the relay threads' timing. Per exchange: the sends of the messages it
originates, then its relayed pieces, each in ``step_order``'s order (chunk waves, phases, then
schedule order); exchange after exchange as the caller starts them. So while an earlier exchange of the
calling thread is still relaying (ExchangeTags ``tail``), a new exchange posts its sends from its
own thread once that one has posted all of its own; its receives are posted at once. A receiver
posts its receives from one peer in the same order: the peer's first hops, then its relays (each in
``step_order``'s order). A proxy's next exchange may therefore leave after its previous relays (the
prediction times relays within an exchange in this order, not this wait across exchanges).

Tags (distributed/tags.py): an exchange takes its tag slot from the ``ExchangeTags`` of its group,
passed explicitly (``tags=``); ``tag`` separates the exchanges a caller keeps in flight together;
start() first joins the relay last run in its slot (bounded by the group's timeout, re-raising its
error), and ``ExchangeTags.drain()`` joins them all. Every rank of the domain must build its
StepExchanges from the same op lists in the same order, from one ExchangeTags per group (the ops come
from the Plan, which all ranks share): tags and slots then agree and nothing deadlocks.

Worked example (no communication needed): one direct op of 2 rows from rank 0 to itself.

>>> import torch
>>> from megatron_zeppelin.planner.types import CommOp
>>> op = CommOp("intra", 0, 0, 0, 0, 0, 0, 0, 0, 2, 8, "nvlink", -1, "direct")
>>> from megatron_zeppelin.distributed.tags import ExchangeTags
>>> ex = StepExchange([op], rank=0, group=None, payload={(0, 0): torch.arange(4.).view(2, 2)}, width=2,
...                   tags=ExchangeTags())
>>> ex.start().wait()[(0, 0, 0)].tolist()
[[0.0, 1.0], [2.0, 3.0]]
"""

from __future__ import annotations

import sys
import threading
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from megatron_zeppelin.planner.program import step_order
from megatron_zeppelin.planner.types import CommOp
from megatron_zeppelin.distributed.counters import CommCounters
from megatron_zeppelin.distributed.p2p import CommError, P2PExchange, group_timeout_s
from megatron_zeppelin.distributed.tags import MAX_TAG, OP_BITS, SLOTS, ExchangeTags

Key = Tuple[int, int, int, int]  # (ring, block, msg_src, msg_dst)


def mirror(op: CommOp) -> CommOp:
    """The op carrying the same rows the other way (gradients going home)."""
    return replace(op, src=op.dst, dst=op.src, msg_src=op.msg_dst, msg_dst=op.msg_src)


class StepExchange:
    """Executes ``ops`` (all ops of one (queue, step) that are active, identical on every rank).

    payload: messages this rank originates, keyed (ring, block, msg_dst) or (ring, block), each a
    ``[rows, width]`` tensor, unchanged until wait(). ``width``: channels per row, an int or
    ``f(ring) -> int``. ``tags``: the group's tag sequence (distributed/tags.py). wait() returns the
    messages that end here, keyed (ring, block, msg_src).
    """

    def __init__(self, ops: Sequence[CommOp], rank: int, group, payload: Dict[tuple, torch.Tensor],
                 width: Union[int, Callable[[int], int]], *, dtype: Optional[torch.dtype] = None,
                 device=None, reverse: bool = False, counters: Optional[CommCounters] = None,
                 phase: str = "fwd", tag: int = 0, tags: ExchangeTags):
        ops = [mirror(o) for o in ops] if reverse else list(ops)
        self.ops = ops
        self.rank, self.group, self.payload = rank, group, payload
        self.width = width if callable(width) else (lambda _r, w=width: w)
        ref = next(iter(payload.values()), None)
        self.dtype = dtype or (ref.dtype if ref is not None else torch.get_default_dtype())
        self.device = device or (ref.device if ref is not None else torch.device("cpu"))
        self.counters, self.phase = counters, phase
        if not 0 <= tag < MAX_TAG or len(ops) >= 2 ** OP_BITS:
            raise CommError(f"StepExchange tag {tag} must be in [0, {MAX_TAG}) and hold < {2 ** OP_BITS} "
                            f"ops (got {len(ops)})")
        self.tags = tags
        self._slot = (tag, tags.take(tag))
        self._tag = (tag * SLOTS + self._slot[1]) << OP_BITS
        # the program's order of the whole exchange (planner/program.py step_order: phases; a routed
        # piece's chunks as a pipeline), the same on every rank
        order, _ = step_order([(o.stage, o.src, o.dst, (o.ring, o.block, o.msg_src, o.msg_dst), o.start, o.stop,
                                o.src != o.msg_src) for o in ops], reverse=reverse)
        pos = {i: p for p, i in enumerate(order)}
        # this rank's ops as (index, op) (the index is the op's tag: the same on both sides)
        mine = sorted(((i, o) for i, o in enumerate(ops) if rank in (o.src, o.dst)), key=lambda x: pos[x[0]])
        # receives from one peer in the order it posts its sends: its first hops, then its relays
        self._recvs = sorted(((i, o) for i, o in mine if o.dst == rank and o.src != rank),
                             key=lambda x: x[1].src != x[1].msg_src)
        self._first = [(i, o) for i, o in mine if o.src == rank and o.msg_src == rank]  # data at hand
        self._relayed = [(i, o) for i, o in mine if o.src == rank and o.msg_src != rank]  # wait for a piece
        self._rows: Dict[Key, int] = {}
        for o in ops:
            k = (o.ring, o.block, o.msg_src, o.msg_dst)
            self._rows[k] = max(self._rows.get(k, 0), o.stop)
        self._pieces: Dict[Key, List[Tuple[int, int, torch.Tensor]]] = {}
        self._done: Dict[Tuple[int, int, int], torch.Tensor] = {}
        self._landed = set()  # recv indices already delivered
        self._bufs: Dict[int, torch.Tensor] = {}
        self._ex: Optional[P2PExchange] = None
        self._req: Dict[int, object] = {}  # op index -> its request (this rank's sends and recvs)
        self._state = "new"
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        # set by the thread once it posted its first hops / all its sends (also when it failed)
        self._first_posted, self._posted = threading.Event(), threading.Event()
        self._posted_all = False  # every send of this rank posted (False while posting or if that failed)
        self._stream = self._event = None  # CUDA: the relay's side stream and its end event
        self._first_event = None  # CUDA: the side stream after the first hops (self-hops delivered)

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

    # --- posting and progress ---------------------------------------------------------------
    def _send(self, sends, i: int, o: CommOp) -> None:
        """Queue op i's rows for sending, or copy them here (self-hop)."""
        data = self._rows_of(o)
        if o.dst == self.rank:
            self._deliver(o, data.clone())  # self-hop: no message
            return
        sends.append((o.dst, data, self._tag + i))

    def _count(self) -> None:
        """Count every send of this rank at start(): relays may end after the caller's wait()."""
        if self.counters is None:
            return
        size = torch.empty((), dtype=self.dtype).element_size()
        for _, o in self._first + self._relayed:
            if o.dst != self.rank:
                nb = (o.stop - o.start) * self.width(o.ring) * size
                self.counters.add_bytes(o.link, o.nic, nb, (self.phase, o.queue, o.step), rows=o.stop - o.start)

    def _land(self, i: int, o: CommOp) -> None:
        """Wait for receive i and deliver its rows (each receive is landed by one thread only)."""
        if i in self._landed:
            return
        self._wait_req(i)
        self._deliver(o, self._bufs[i])
        self._landed.add(i)

    def _source_of(self, o: CommOp):
        """The receive that brings the rows ``o`` forwards (None: a self-hop brought them earlier)."""
        for i, r in self._recvs:
            if (r.ring, r.block, r.msg_src, r.msg_dst) == (o.ring, o.block, o.msg_src, o.msg_dst) \
                    and r.start <= o.start and o.stop <= r.stop and r.dst != r.msg_dst:
                return i, r
        return None

    def _post(self, sends, recvs) -> None:
        ex = P2PExchange(sends, recvs, self.group).start()
        for j, (_, _, t) in enumerate(sends + recvs):
            self._req[t - self._tag] = (ex, j)
        self._exs.append(ex)

    def _wait_req(self, i: int) -> None:
        ex, j = self._req[i]
        ex.wait_one(j)

    def start(self) -> "StepExchange":
        if self._state != "new":
            raise CommError(f"StepExchange.start() called twice (state {self._state})")
        self._state = "started"
        prev = self.tags.release(*self._slot)
        if prev is not None:  # its messages used this slot's tags: they must all have matched
            prev.join()
        self._exs: List[P2PExchange] = []
        self._count()
        recvs = []
        for i, o in self._recvs:
            self._bufs[i] = torch.empty((o.stop - o.start, self.width(o.ring)), dtype=self.dtype, device=self.device)
            recvs.append((o.src, self._bufs[i], self._tag + i))
        before = self.tags.tail()  # the caller's last exchange still posting its sends, if any
        if before is not None and before._posted.is_set():
            before = None
        if not self._relayed and before is None:  # nothing to wait for: everything from here, one batch
            sends = []
            for i, o in self._first:
                self._send(sends, i, o)
            self._post(sends, recvs)
            self._posted_all = True
            self._first_posted.set()
            self._posted.set()
            return self
        self._post([], recvs)
        # sends from a thread: after the earlier exchange's, then each relayed piece as it arrives
        if self.device.type == "cuda":
            self._stream = torch.cuda.Stream(self.device)
            self._stream.wait_stream(torch.cuda.current_stream(self.device))  # buffers are allocated
        self._thread = threading.Thread(target=self._relay, args=(before,), daemon=True,
                                        name=f"zeppelin-relay-r{self.rank}-t{self._tag >> OP_BITS}")
        self.tags.hold(*self._slot, self)
        self.tags.follow(self)
        self._thread.start()
        return self

    def _relay(self, before: Optional["StepExchange"]) -> None:
        """Background: after ``before`` posted its sends, post the first hops, then per relayed op
        (phase order) wait for its piece and send it on."""
        try:
            with torch.no_grad():  # no autograd runs through communication
                if self._stream is not None:
                    torch.cuda.set_device(self.device)
                    with torch.cuda.stream(self._stream):
                        self._post_all(before)
                        self._event = torch.cuda.Event()
                        self._event.record(self._stream)
                else:
                    self._post_all(before)
        except BaseException as e:  # noqa: BLE001 -- handed to the caller's thread by wait() or a join
            self._error = e
            # the caller may be blocked on a request this failure leaves unmatched until the group's
            # timeout: say the cause now, where the run's output shows it
            sys.stderr.write(f"rank {self.rank}: relay of exchange (tag {self._tag >> OP_BITS}) failed: "
                             f"{type(e).__name__}: {e}\n")
        finally:
            self._first_posted.set()
            self._posted.set()

    def _post_all(self, before: Optional["StepExchange"]) -> None:
        if before is not None:
            before.await_posted()
        sends = []
        for i, o in self._first:
            self._send(sends, i, o)
        if sends:
            self._post(sends, [])
        if self._stream is not None:  # self-hops copied here on the side stream: wait() orders after them
            self._first_event = torch.cuda.Event()
            self._first_event.record(self._stream)
        self._first_posted.set()
        for i, o in self._relayed:
            src = self._source_of(o)
            if src is not None:
                self._land(*src)
            sends = []
            self._send(sends, i, o)
            if sends:
                self._post(sends, [])
        self._posted_all = True
        self._posted.set()
        for i, o in self._relayed:
            if o.dst != self.rank:
                self._wait_req(i)  # sent: the buffers may go

    def await_posted(self) -> None:
        """Wait (bounded) until this exchange has posted all its sends; raise if it could not."""
        if not self._posted.wait(self._limit()):
            raise CommError(f"rank {self.rank}: routed exchange (tag {self._tag >> OP_BITS}) did not post its "
                            f"relayed pieces within {self._limit():.0f}s: a peer did not post its matching stage")
        if not self._posted_all:
            raise CommError(f"rank {self.rank}: an earlier exchange on the group failed before posting all its "
                            f"sends ({type(self._error).__name__}: {self._error}); later sends would pair wrongly")

    def _limit(self) -> float:
        return group_timeout_s(self.group) + 30.0  # the requests themselves time out first

    def join(self) -> None:
        """Wait for the whole relay (bounded); re-raise its error."""
        self._thread.join(self._limit())
        if self._thread.is_alive():
            raise CommError(f"rank {self.rank}: routed exchange (tag {self._tag >> OP_BITS}) did not finish "
                            f"within {self._limit():.0f}s: a peer did not post its matching stage")
        err, self._error = self._error, None  # reported once (by wait() or by a later join)
        if err is not None:
            raise err

    def wait(self) -> Dict[Tuple[int, int, int], torch.Tensor]:
        if self._state == "new":
            raise CommError("StepExchange.wait() called before start()")
        if self._state == "done":
            raise CommError("StepExchange.wait() called twice")
        self._state = "done"
        if self._thread is not None and self._first:  # its first hops are posted by the thread
            if not self._first_posted.wait(self._limit()):
                raise CommError(f"rank {self.rank}: exchange (tag {self._tag >> OP_BITS}) could not post its sends "
                                f"within {self._limit():.0f}s: an earlier exchange's relay did not finish posting")
            if self._error is not None and any(i not in self._req for i, _ in self._first):
                self.join()  # re-raises the thread's error
            if self._first_event is not None:
                torch.cuda.current_stream(self.device).wait_event(self._first_event)
        # own part: sends of messages originating here, pieces of messages ending here
        for i, o in self._first:
            if o.dst != self.rank:
                self._wait_req(i)
        for i, o in self._recvs:
            if o.dst == o.msg_dst:
                self._land(i, o)
        # A pure proxy does not wait for the pieces it relays (on CPU and CUDA alike: the planner and
        # the simulator time it so), the last hop to another rank's message included; only a relayed
        # self-hop ending here (the relay thread fills this rank's results) makes this rank join.
        joined = self._thread is not None and any(o.dst == o.msg_dst == self.rank for _, o in self._relayed)
        if joined:
            self.join()
        if self._thread is None:
            for ex in self._exs:  # everything was waited above: this only marks the handles done
                ex.wait()
        if joined and self._event is not None:  # the caller's stream uses the results after the relay's copies
            cur = torch.cuda.current_stream(self.device)
            cur.wait_event(self._event)
            for t in self._done.values():
                t.record_stream(cur)
        return self._done
