"""The plan-ahead planner in a process of its own (plan_ahead.py's ``--zeppelin-plan-ahead-worker
process``): the training process hands it document lengths and gets Plans back, and planning never
holds the training process's GIL (a pure-Python planner on a thread of that process holds it for
hundreds of milliseconds on a large batch, while the step's own thread launches kernels).

The worker is spawned (multiprocessing's "spawn" context: no forked copy of a process that holds
CUDA or gloo state) with a pickled copy of the run's Planner, so it plans with the same cost model
and returns the Plans the Planner would make in the training process. A Plan comes back pickled:
a frozen value of plain dataclasses, it pickles several times faster than its JSON form and its
digest (benchmarks/bench_plan_ahead.py measures both, ``transfer``). The bytes are unpickled where
the step takes the Plan, not on a receiving thread: ``pickle.loads`` runs in C without handing the
GIL over, so a thread would hold it for the whole load.

The worker is the training process's only child of its kind, started and stopped with the run
(``close`` joins it: stop message, then terminate, then kill). Every wait has a timeout: the
training process polls the worker's replies and checks that it is alive, so a dead worker is an
error naming the batch it was planning (:class:`PlanAheadError`), never a hang; a worker whose
parent died exits by itself. A worker that never came up (it could not be spawned, the planner
does not pickle, the child died before it was ready) is :class:`CannotStart`: the caller falls back
to planning on a thread.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import queue
import sys
import time
import types
from typing import Callable, Dict, Optional, Sequence, Tuple

START_TIMEOUT_S = 120.0  # spawn, import the planner, unpickle it (a loaded host imports slowly)
PLAN_TIMEOUT_S = 600.0  # one batch planned (128k documents plan in seconds: this only stops a hang)
POLL_S = 0.2  # how often a waiting step checks that the worker lives
JOIN_S = 10.0  # close: the worker's own exit, then terminate, then kill, each waited this long


class PlanAheadError(RuntimeError):
    """The plan-ahead worker process died or stopped answering; the message names the batch."""


class CannotStart(RuntimeError):
    """No worker process could be started here; planning falls back to a thread."""


def describe(seq: int, key: Sequence[int]) -> str:
    """A batch as errors name it: its number in submission order, documents and tokens."""
    return f"batch #{seq} ({len(key)} documents, {sum(key)} tokens)"


class PlanProcess:
    """A spawned process planning submitted batches in order with a copy of ``planner``.

    ``submit(key)`` returns the batch's number; ``result(seq, key)`` waits for that batch's Plan
    (or raises the planner's own error for it); ``drop(seq)`` tells the worker to skip a batch
    (and every earlier one) it has not begun; ``close()`` stops and joins it."""

    def __init__(self, planner, start_timeout_s: float = START_TIMEOUT_S, plan_timeout_s: float = PLAN_TIMEOUT_S,
                 digests: bool = False):
        """``digests``: the worker also sends each Plan's digest (plan_share.py broadcasts it with
        the Plan's bytes; hashing there keeps it off the training process)."""
        import multiprocessing as mp

        self.start_timeout_s, self.plan_timeout_s = start_timeout_s, plan_timeout_s
        self._seq = 0
        self._replies: Dict[int, Tuple[str, bytes, str]] = {}  # answered, not yet taken (raw bytes, digest)
        self._ready = False
        try:
            ctx = mp.get_context("spawn")
            self._requests, self._answers = ctx.Queue(), ctx.Queue()
            self._floor = ctx.RawValue("q", -1)  # batches numbered <= floor were dropped: skip them
            self._proc = ctx.Process(target=_serve, name="zeppelin-plan-ahead",
                                     args=(planner, self._requests, self._answers, self._floor, os.getpid(), digests),
                                     daemon=True)  # never outlives the run, even one that skips close()
            with _main_hidden():
                self._proc.start()  # pickles the planner: a planner that does not pickle fails here
        except Exception as e:  # OSError (no semaphores, no fork), pickling errors, a daemonic parent
            raise CannotStart(f"{type(e).__name__}: {e}") from None
        self._started = time.monotonic()
        # a worker that is dead or stuck never makes the run wait at exit for the queue's feeder
        self._requests.cancel_join_thread()

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid

    def submit(self, key: Tuple[int, ...]) -> int:
        self._seq += 1
        self._requests.put((self._seq, key))  # pickled and written by the queue's feeder thread
        return self._seq

    def drop(self, seq: int) -> None:
        self._replies.pop(seq, None)
        self._floor.value = max(self._floor.value, seq)

    def result(self, seq: int, key: Sequence[int]):
        """The Plan of batch ``seq`` (its lengths ``key``, for the error messages)."""
        kind, payload, _ = self.result_bytes(seq, key)
        obj = pickle.loads(payload)
        if kind == "error":
            raise obj
        return obj

    def result_bytes(self, seq: int, key: Sequence[int], stop: Optional[Callable[[], bool]] = None):
        """Batch ``seq``'s answer as it came: ("plan", pickled Plan, its digest or "") or ("error",
        pickled exception, ""); None if ``stop()`` turns true first (checked every ``POLL_S``)."""
        asked = time.monotonic()
        while seq not in self._replies:
            try:
                msg = self._answers.get(timeout=POLL_S)
            except queue.Empty:
                if stop is not None and stop():
                    return None
                self._check(seq, key, asked)
                continue
            self._keep(msg)
        return self._replies.pop(seq)

    def _keep(self, msg) -> None:
        if msg[0] == "ready":
            self._ready = True
            return
        kind, got, payload, digest = msg
        if got > self._floor.value:  # a dropped batch's answer is nobody's
            self._replies[got] = (kind, payload, digest)

    def _check(self, seq: int, key, asked: float) -> None:
        now = time.monotonic()
        if not self._proc.is_alive():
            while True:  # what it sent just before it exited
                try:
                    self._keep(self._answers.get(timeout=POLL_S))
                except queue.Empty:
                    break
            if seq in self._replies:
                return
            if not self._ready:
                raise CannotStart(f"the worker process exited with code {self._proc.exitcode} before it was ready")
            raise PlanAheadError(f"the plan-ahead worker process (pid {self._proc.pid}) died with exit code "
                                 f"{self._proc.exitcode} while planning {describe(seq, key)}; rerun with "
                                 "--zeppelin-plan-ahead-worker thread, or --no-zeppelin-plan-ahead, to plan "
                                 "in the training process")
        if not self._ready and now - self._started > self.start_timeout_s:
            raise CannotStart(f"the worker process was not ready within {self.start_timeout_s:.0f} s")
        if self._ready and now - asked > self.plan_timeout_s:
            raise PlanAheadError(f"the plan-ahead worker process (pid {self._proc.pid}) has not returned "
                                 f"{describe(seq, key)} within {self.plan_timeout_s:.0f} s")

    def close(self) -> None:
        """Stop the worker and join it: its own exit after the stop message (a plan in progress
        finishes first), else SIGTERM, else SIGKILL; each waited ``JOIN_S``."""
        try:
            self._requests.put(None)
        except (OSError, ValueError):  # the queue is already closed
            pass
        deadline = time.monotonic() + JOIN_S
        while self._proc.is_alive() and time.monotonic() < deadline:
            try:  # read what it still sends, so its exit never waits on a full pipe
                self._answers.get(timeout=POLL_S)
            except queue.Empty:
                pass
        for stop in (self._proc.terminate, self._proc.kill):
            if not self._proc.is_alive():
                break
            stop()
            self._proc.join(JOIN_S)
        self._proc.join(JOIN_S)
        self._requests.close()
        self._answers.close()
        self._replies.clear()


@contextlib.contextmanager
def _main_hidden():
    """A spawned child first runs the parent's main script again (as ``__mp_main__``), so that
    classes defined there unpickle. The worker needs none of it (the Planner is the package's),
    and a training script's main imports megatron and torch (seconds and gigabytes per rank), or,
    without an ``if __name__ == "__main__"`` guard, would train again in the child. So while the
    child starts, the main module it is told about is an empty one."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _serve(planner, requests, answers, floor, parent: int, digests: bool = False) -> None:
    """The worker: plan each request in order, answer with the pickled Plan (and its digest, with
    ``digests``) or the pickled error, until the stop message or the parent's death. It is a
    process of its own, so its garbage collector can stay off while it plans (the planner
    allocates many objects and no cycles) and run between batches."""
    gc.disable()
    answers.put(("ready",))
    while True:
        try:
            msg = requests.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # the training process is gone: nobody will take a plan
                break
            continue
        if msg is None:
            break
        seq, key = msg
        if seq <= floor.value:  # dropped before it began
            continue
        try:
            plan = planner.plan(list(key))
            answers.put(("plan", seq, pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL),
                         plan.digest() if digests else ""))
        except Exception as e:  # the planner's error for this batch: raised where the step takes it
            answers.put(("error", seq, _pickled_error(e), ""))
        gc.collect()
    answers.cancel_join_thread()  # exit now, even if nobody reads what is left


def _pickled_error(e: Exception) -> bytes:
    try:
        data = pickle.dumps(e)
        pickle.loads(data)  # an exception whose constructor takes other arguments fails here
        return data
    except Exception:
        return pickle.dumps(RuntimeError(f"{type(e).__name__}: {e}"))
