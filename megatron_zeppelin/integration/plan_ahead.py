"""Plan the next global micro-batch while the current one trains.

A Plan needs only its batch's document lengths, and planning is pure (planner/): so the data
iterator reads one batch ahead (``PlannedBatches``) and a worker plans that batch while the forward
and backward of the current one run; the forward step then takes its Plan ready
(``PlanAhead.take``), or plans the batch itself where none was planned ahead (the first batch, a
batch Megatron replays, one dropped from the queue). Planning then leaves the step's critical path:
up to a second a batch with --zeppelin-balance-memory on 16k documents (docs/partitioner.md).

The worker (``--zeppelin-plan-ahead-worker``) is a spawned process by default (plan_process.py):
a pure-Python planner on a thread of the training process would hold its GIL, in turns of 5 ms,
against the thread that launches the step's kernels. The process plans with a pickled copy of the
run's Planner, so its Plans are the ones the Planner makes in the training process (the same
digests; every rank still plans every batch, and plan_check still compares them). Where no process
can start (the planner does not pickle, the host allows no child, the child dies before it is
ready) it says so once and plans on a thread instead; ``Worker.THREAD`` asks for the thread.

Worked example, with a stand-in planner that records what it plans (on a thread: a class defined
in a doctest cannot be unpickled in another process):

>>> class Recorder:
...     seen = []
...     def plan(self, lengths):
...         self.seen.append(tuple(lengths))
...         return sum(lengths)
>>> ahead = PlanAhead(Recorder(), worker=Worker.THREAD)
>>> batches = PlannedBatches(iter([[3, 4], [5], [6, 7]]), ahead, lengths_of=list)
>>> next(batches), ahead.take([3, 4]), ahead.ahead   # batch 1 is read and planned meanwhile
([3, 4], 7, True)
>>> next(batches), ahead.take([5]), ahead.waited_s >= 0.0
([5], 5, True)
>>> next(batches), ahead.take([6, 7]), next(batches, "no more")
([6, 7], 13, 'no more')
>>> ahead.take([9, 9]), ahead.ahead    # never planned ahead: planned now
(18, False)
>>> ahead.close(); Recorder.seen
[(3, 4), (5,), (6, 7), (9, 9)]
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from enum import StrEnum
from typing import Callable, Iterator, Optional, Sequence, Union

from megatron_zeppelin.integration.plan_process import CannotStart, PlanProcess

KEEP = 4  # plans waiting to be taken, at most (the train and validation iterators each read one ahead)


class Worker(StrEnum):
    """Where batches are planned ahead (``--zeppelin-plan-ahead-worker``)."""
    PROCESS = "process"  # a spawned process: planning never holds the training process's GIL
    THREAD = "thread"  # a thread of the training process: the fallback where no process starts


_SAID = []  # the fallback already printed by this process (it is said once)


def _say_once(reason: str) -> None:
    if not _SAID:
        _SAID.append(reason)
        print(f"zeppelin plan-ahead: no worker process ({reason}); planning ahead on a thread of the "
              "training process instead", file=sys.stderr, flush=True)


class PlanAhead:
    """Plans submitted batches on one worker (``worker``: a process, else a thread), in order.
    ``take`` returns a batch's Plan (its planning error raised there, as planning in the step
    would); after it, ``ahead``: whether the worker had planned it, ``waited_s``: how long the step
    waited for it (or planned it). ``worker`` then says which worker plans, and ``fallback`` why
    it is a thread where a process was asked for ("" otherwise)."""

    def __init__(self, planner, keep: int = KEEP, worker: Union[Worker, str] = Worker.PROCESS):
        self.planner = planner
        self.keep = keep
        self.waited_s, self.ahead = 0.0, False
        self.worker, self.fallback = Worker(worker), ""
        # a batch's lengths -> its Future (thread) or its number (process), in submission order
        self._pending: "OrderedDict[tuple, Union[Future, int]]" = OrderedDict()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._proc: Optional[PlanProcess] = None
        if self.worker is Worker.PROCESS:
            try:
                self._proc = PlanProcess(planner)
            except CannotStart as e:
                self._fall_back(str(e))
        else:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zeppelin-plan-ahead")

    def _fall_back(self, reason: str) -> None:
        """Plan on a thread from now on; what the process had pending is planned there again."""
        if self._proc is not None:
            self._proc.close()
            self._proc = None
        self.worker, self.fallback = Worker.THREAD, reason
        _say_once(reason)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zeppelin-plan-ahead")
        for key in self._pending:
            self._pending[key] = self._pool.submit(self.planner.plan, list(key))

    def submit(self, lengths: Sequence[int]) -> None:
        key = tuple(int(x) for x in lengths)
        if key in self._pending:
            return
        if self._proc is not None:
            self._pending[key] = self._proc.submit(key)
        else:
            self._pending[key] = self._pool.submit(self.planner.plan, list(key))
        while len(self._pending) > self.keep:  # an iterator read ahead and never taken (e.g. validation)
            old = self._pending.popitem(last=False)[1]
            if isinstance(old, Future):
                old.cancel()
            else:
                self._proc.drop(old)

    def take(self, lengths: Sequence[int]):
        key = tuple(int(x) for x in lengths)
        t0 = time.perf_counter()
        got = self._pending.pop(key, None)
        self.ahead = got is not None and not (isinstance(got, Future) and got.cancelled())
        if not self.ahead:
            plan = self.planner.plan(list(key))
        elif isinstance(got, Future):
            plan = got.result()
        else:
            try:
                plan = self._proc.result(got, key)
            except CannotStart as e:  # the process never came up: this batch now, the rest on a thread
                self._fall_back(str(e))
                plan, self.ahead = self.planner.plan(list(key)), False
        self.waited_s = time.perf_counter() - t0
        return plan

    def __reduce__(self):
        """Pickled as None: Megatron saves its args (where the run keeps this) in each checkpoint,
        and a worker thread is no state to save."""
        return (_nothing, ())

    def close(self) -> None:
        """Drop what is still queued and join the worker (a plan in progress finishes first)."""
        if self._proc is not None:
            self._proc.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()


def _nothing():
    return None


class PlannedBatches:
    """Batches of ``batches`` in order, each submitted to ``ahead`` for planning one batch before
    it is returned (``lengths_of``: a batch's document lengths); an empty one (no documents:
    data.py JointBatches) is not planned."""

    def __init__(self, batches: Iterator, ahead: PlanAhead, lengths_of: Callable[[object], Sequence[int]]):
        self._it, self._ahead, self._lengths_of = iter(batches), ahead, lengths_of
        self._next = None  # (batch,) read ahead, or None before the first

    def __iter__(self):
        return self

    def _read(self):
        try:
            batch = next(self._it)
        except StopIteration:
            return ()
        lengths = self._lengths_of(batch)
        if len(lengths):
            self._ahead.submit(lengths)
        return (batch,)

    def __next__(self):
        cur = self._read() if self._next is None else self._next
        if not cur:
            raise StopIteration
        self._next = self._read()
        return cur[0]
