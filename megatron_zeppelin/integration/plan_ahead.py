"""Plan the next global micro-batch while the current one trains.

A Plan needs only its batch's document lengths, and planning is pure (planner/): so the data
iterator reads one batch ahead (``PlannedBatches``) and a worker thread plans that batch while the
forward and backward of the current one run; the forward step then takes its Plan ready
(``PlanAhead.take``), or plans the batch itself where none was planned ahead (the first batch, a
batch Megatron replays, one dropped from the queue). The worker plans with the run's one Planner,
so the Plan is the one the step would have made (every rank still plans every batch the same way,
and plan_check still compares them). Planning then leaves the step's critical path: up to a
second a batch with --zeppelin-balance-memory on 16k documents (docs/partitioner.md).

Worked example, with a stand-in planner that records what it plans:

>>> class Recorder:
...     seen = []
...     def plan(self, lengths):
...         self.seen.append(tuple(lengths))
...         return sum(lengths)
>>> ahead = PlanAhead(Recorder())
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

import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator, Sequence

KEEP = 4  # plans waiting to be taken, at most (the train and validation iterators each read one ahead)


class PlanAhead:
    """Plans submitted batches on one worker thread, in order. ``take`` returns a batch's Plan (its
    planning error raised there, as planning in the step would); after it, ``ahead``: whether the
    worker had planned it, ``waited_s``: how long the step waited for it (or planned it)."""

    def __init__(self, planner, keep: int = KEEP):
        self.planner = planner
        self.keep = keep
        self.waited_s, self.ahead = 0.0, False
        self._pending: "OrderedDict[tuple, Future]" = OrderedDict()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zeppelin-plan-ahead")

    def submit(self, lengths: Sequence[int]) -> None:
        key = tuple(int(x) for x in lengths)
        if key in self._pending:
            return
        self._pending[key] = self._pool.submit(self.planner.plan, list(key))
        while len(self._pending) > self.keep:  # an iterator read ahead and never taken (e.g. validation)
            self._pending.popitem(last=False)[1].cancel()

    def take(self, lengths: Sequence[int]):
        key = tuple(int(x) for x in lengths)
        t0 = time.perf_counter()
        got = self._pending.pop(key, None)
        self.ahead = got is not None and not got.cancelled()
        plan = got.result() if self.ahead else self.planner.plan(list(key))
        self.waited_s = time.perf_counter() - t0
        return plan

    def __reduce__(self):
        """Pickled as None: Megatron saves its args (where the run keeps this) in each checkpoint,
        and a worker thread is no state to save."""
        return (_nothing, ())

    def close(self) -> None:
        """Drop what is still queued and join the worker (a plan in progress finishes first)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()


def _nothing():
    return None


class PlannedBatches:
    """Batches of ``batches`` in order, each submitted to ``ahead`` for planning one batch before
    it is returned (``lengths_of``: a batch's document lengths)."""

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
        self._ahead.submit(self._lengths_of(batch))
        return (batch,)

    def __next__(self):
        cur = self._read() if self._next is None else self._next
        if not cur:
            raise StopIteration
        self._next = self._read()
        return cur[0]
