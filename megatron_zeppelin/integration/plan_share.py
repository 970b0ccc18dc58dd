"""One rank of the domain plans each global micro-batch; the others receive its Plan
(``--zeppelin-plan-sharing one-per-domain``).

Every rank of a Zeppelin domain (the DP group of one TP / PP slice) would make the same Plan: planning
is pure. Planning a batch costs seconds of CPU (a pure-Python planner), receiving its pickled Plan
tens of milliseconds (unpickle, then the digest check; benchmarks/bench_plan_share.py). So the
domain's rank 0 plans (on its plan-ahead worker: the spawned process of plan_process.py, or a
thread) and broadcasts each Plan's bytes over a gloo group made for this alone at start-up
(:func:`share_group`: it never queues behind, or shares NCCL streams with, the step's collectives;
only the sharing thread uses it, since two threads' collectives on one group could pair up wrongly).
Each rank unpickles what it got and checks that the Plan hashes to the digest the planning rank sent
(plan_check's comparison across the domain still runs where it ran before).

The broadcasts run on a thread of each rank (``zeppelin-plan-share``), in submission order: the
planning rank's thread waits for its worker's Plan and sends it; a receiving rank's thread waits in
the broadcast. Both happen while the batch before trains, where plan-ahead already hides the
planning; the step only takes the bytes (``take``) and unpickles them there (pickle.loads runs in C
without handing the GIL over, so a thread would hold it for the whole load: plan_process.py).
Every rank submits the same batches in the same order (they read the same documents), so the
threads' broadcasts pair up; what the planning rank sends decides: a Plan, an error, or "skipped"
(a batch the planning rank's queue dropped, or one still queued at close).

Nothing hangs and every failure names the planning rank and the batch, on every rank: a planner error
or a dead worker process on the planning rank is broadcast as an error (:class:`PlanShareError`); a
receiving rank whose broadcast times out (the group's timeout) or breaks (the planning rank died)
says which rank it waited for, and every later batch fails the same way.
"""

from __future__ import annotations

import pickle
import queue
import threading
import time
from collections import OrderedDict
from datetime import timedelta
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from megatron_zeppelin.integration.plan_ahead import KEEP, Worker, _say_once
from megatron_zeppelin.integration.plan_check import PlanMismatchError
from megatron_zeppelin.integration.plan_process import CannotStart, PlanAheadError, PlanProcess, describe

PLAN, ERROR, SKIP = 0, 1, 2  # what the planning rank sends for a batch (the header's first word)
BROKEN = 3  # this rank's broadcast of the batch failed or timed out (never sent)
POLL_S = 0.2  # how often a waiting step checks that the sharing thread lives


class PlanShareError(RuntimeError):
    """A batch's Plan did not reach this rank; the message names the planning rank and the batch."""


class ShareGroup:
    """A domain's plan-sharing group: ``group`` (gloo), the planning rank ``src`` (global rank: the
    domain's lowest), this rank ``rank`` (global), and the group's timeout ``timeout_s``."""

    def __init__(self, group, ranks: Sequence[int], rank: int, timeout_s: float):
        self.group, self.ranks, self.rank, self.timeout_s = group, tuple(ranks), rank, timeout_s
        self.src = self.ranks[0]

    @property
    def planning(self) -> bool:
        return self.rank == self.src

    def __reduce__(self):
        """Pickled as None (Megatron saves its args, where the run keeps this, in each checkpoint)."""
        return (_nothing, ())


def _nothing():
    return None


def share_group(domain_ranks: Sequence[int], timeout: timedelta) -> Optional[ShareGroup]:
    """Collective over the whole job, at start-up: every rank passes its domain's global ranks and
    gets its domain's ShareGroup (every domain's gloo group is made on every rank, in one order, as
    torch requires); None where domains have one rank (nothing to share)."""
    ranks = sorted(int(r) for r in domain_ranks)
    domains = [None] * dist.get_world_size()
    dist.all_gather_object(domains, ranks)
    if len(ranks) == 1:
        return None
    group, _ = dist.new_subgroups_by_enumeration(sorted(set(map(tuple, domains))), timeout=timeout, backend="gloo")
    return ShareGroup(group, ranks, dist.get_rank(), timeout.total_seconds())


class _Job:
    """One batch to share: its number (the same on every rank), lengths, the worker's number for
    it (planning rank, process worker), and what came of it."""

    __slots__ = ("n", "key", "seq", "dropped", "done", "status", "payload", "digest", "plan", "error")

    def __init__(self, n: int, key: Tuple[int, ...], seq: Optional[int]):
        self.n, self.key, self.seq = n, key, seq
        self.dropped = False
        self.done = threading.Event()
        self.status, self.payload, self.digest, self.plan, self.error = SKIP, b"", "", None, None

    def finish(self, status: int, payload: bytes = b"", digest: str = "", plan=None, error=None) -> None:
        self.status, self.payload, self.digest, self.plan, self.error = status, payload, digest, plan, error
        self.done.set()


def _digest_words(digest: str) -> Tuple[int, int]:
    v = int(digest, 16) if digest else 0
    return v >> 32, v & 0xFFFFFFFF


class SharedPlanAhead:
    """PlanAhead's interface (``submit``, ``take``, ``close``, ``ahead``, ``waited_s``, ``worker``,
    ``fallback``) for one domain whose rank ``share.src`` plans: there on ``worker`` (a spawned
    process, else this object's thread), the other ranks plan nothing and take the Plans it
    broadcasts. ``take`` of a batch never submitted (no plan-ahead, a replayed batch) shares it
    then, after the batches queued before it."""

    def __init__(self, planner, share: ShareGroup, keep: int = KEEP, worker: Union[Worker, str] = Worker.PROCESS):
        self.planner, self.share, self.keep = planner, share, keep
        self.waited_s, self.ahead = 0.0, False
        self.worker, self.fallback = Worker(worker), ""
        self._pending: "OrderedDict[tuple, _Job]" = OrderedDict()
        self._n = 0
        self._jobs: "queue.Queue[Optional[_Job]]" = queue.Queue()
        self._closing = threading.Event()
        self._proc: Optional[PlanProcess] = None
        self._proc_ok = False  # the planning rank's worker process takes batches
        if share.planning and self.worker is Worker.PROCESS:
            try:
                self._proc, self._proc_ok = PlanProcess(planner, digests=True), True
            except CannotStart as e:
                self._fall_back(str(e))
        self._thread = threading.Thread(target=self._run, name="zeppelin-plan-share", daemon=True)
        self._thread.start()

    def _fall_back(self, reason: str) -> None:
        """The planning rank plans on this object's thread from now on (the process never came up)."""
        self._proc_ok = False
        self.worker, self.fallback = Worker.THREAD, reason
        _say_once(reason)

    def _who(self) -> str:
        return f"planning rank {self.share.src} (the domain's rank 0 of ranks {list(self.share.ranks)})"

    def _enqueue(self, key: Tuple[int, ...]) -> _Job:
        self._n += 1
        seq = self._proc.submit(key) if self._proc_ok else None
        job = _Job(self._n, key, seq)
        self._jobs.put(job)
        return job

    def submit(self, lengths: Sequence[int]) -> None:
        key = tuple(int(x) for x in lengths)
        if key in self._pending:
            return
        self._pending[key] = self._enqueue(key)
        while len(self._pending) > self.keep:  # an iterator read ahead and never taken (e.g. validation)
            self._pending.popitem(last=False)[1].dropped = True

    def take(self, lengths: Sequence[int]):
        key = tuple(int(x) for x in lengths)
        t0 = time.perf_counter()
        job = self._pending.pop(key, None)
        self.ahead = job is not None
        if job is None:
            job = self._enqueue(key)
        while not job.done.wait(POLL_S):
            if not self._thread.is_alive():
                raise PlanShareError(f"rank {self.share.rank}: the plan-sharing thread stopped before "
                                     f"{describe(job.n, key)} arrived from {self._who()}")
        plan = self._plan_of(job)
        self.waited_s = time.perf_counter() - t0
        return plan

    def _plan_of(self, job: _Job):
        what = describe(job.n, job.key)
        if job.status == BROKEN:
            raise PlanShareError(job.payload.decode()) from job.error
        if job.status == ERROR:
            raise PlanShareError(f"{self._who()} could not plan {what}: "
                                 f"{job.payload.decode(errors='replace')}") from job.error
        if job.status == SKIP:
            raise PlanShareError(f"{self._who()} skipped {what} (its plan-sharing was closing)")
        if job.plan is not None:
            return job.plan
        plan = pickle.loads(job.payload)
        if plan.digest() != job.digest:  # hashed here, from what arrived; kept for plan_check
            raise PlanMismatchError(f"rank {self.share.rank}: the Plan of {what} from {self._who()} hashes to "
                                    f"{plan.digest()}, not the {job.digest} it was sent with")
        return plan

    # -- the sharing thread --------------------------------------------------------------------

    def _run(self) -> None:
        broken: Optional[str] = None
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if broken is not None:  # the group failed once: nothing more arrives on it
                job.finish(BROKEN, broken.encode())
                continue
            try:
                self._send(job) if self.share.planning else self._receive(job)
            except Exception as e:  # noqa: BLE001 - a failed or timed-out broadcast
                broken = self._broken(job, e)
                job.finish(BROKEN, broken.encode(), error=e)

    def _broken(self, job: _Job, e: Exception) -> str:
        """The message every batch from ``job`` on fails with, on this rank."""
        lines = str(e).strip().splitlines()
        what, text = describe(job.n, job.key), f"{type(e).__name__}: {lines[0] if lines else ''}"
        if self.share.planning:
            return (f"planning rank {self.share.rank}: the broadcast of {what} to ranks {list(self.share.ranks)} "
                    f"failed ({text})")
        timed_out = "timed out" in str(e).lower() or "timeout" in str(e).lower()
        how = f"within the group's timeout of {self.share.timeout_s:.0f} s" if timed_out else "(the broadcast broke: did it exit?)"
        return f"rank {self.share.rank} received no Plan for {what} from {self._who()} {how}: {text}"

    def _make(self, job: _Job):
        """The planning rank's answer for ``job``: (status, payload, digest, plan, error)."""
        if job.dropped or self._closing.is_set():
            if job.seq is not None and self._proc_ok:
                self._proc.drop(job.seq)  # every earlier batch was answered already: we go in order
            return SKIP, b"", "", None, None
        if job.seq is not None and self._proc_ok:
            try:
                got = self._proc.result_bytes(job.seq, job.key, stop=self._closing.is_set)
            except CannotStart as e:  # the process never came up: this batch and the rest here
                self._fall_back(str(e))
            except PlanAheadError as e:  # the worker died or stopped answering: every rank hears it
                return ERROR, str(e).encode(), "", None, e
            else:
                if got is None:  # closing
                    return SKIP, b"", "", None, None
                kind, payload, digest = got
                if kind == "error":
                    err = pickle.loads(payload)
                    return ERROR, f"{type(err).__name__}: {err}".encode(), "", None, err
                return PLAN, payload, digest, None, None
        try:  # on this thread: the thread worker, a batch planned in the step, or the fallback
            plan = self.planner.plan(list(job.key))
            return PLAN, pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL), plan.digest(), plan, None
        except Exception as e:  # noqa: BLE001 - the planner's error for this batch
            return ERROR, f"{type(e).__name__}: {e}".encode(), "", None, e

    def _send(self, job: _Job) -> None:
        status, payload, digest, plan, error = self._make(job)
        hi, lo = _digest_words(digest)
        dist.broadcast(torch.tensor([status, len(payload), hi, lo], dtype=torch.int64), self.share.src,
                       group=self.share.group)
        if payload:
            dist.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), self.share.src,
                           group=self.share.group)
        job.finish(status, payload, digest, plan, error)

    def _receive(self, job: _Job) -> None:
        header = torch.zeros(4, dtype=torch.int64)
        dist.broadcast(header, self.share.src, group=self.share.group)
        status, n, hi, lo = (int(x) for x in header)
        payload = b""
        if n:
            buf = torch.empty(n, dtype=torch.uint8)
            dist.broadcast(buf, self.share.src, group=self.share.group)
            payload = buf.numpy().tobytes()
        job.finish(status, payload, f"{(hi << 32) | lo:016x}" if status == PLAN else "")

    def __reduce__(self):
        """Pickled as None: Megatron saves its args (where the run keeps this) in each checkpoint."""
        return (_nothing, ())

    def close(self) -> None:
        """Finish the broadcasts of every submitted batch (the planning rank sends "skipped" for
        those not planned yet, so no peer waits), join the thread, stop the worker process."""
        self._closing.set()
        self._jobs.put(None)
        self._thread.join(self.share.timeout_s + 60)
        if self._proc is not None:
            self._proc.close()
        self._pending.clear()
