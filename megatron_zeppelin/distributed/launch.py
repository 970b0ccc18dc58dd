"""Run a function on N local processes with torch.distributed, never hanging, never orphaning a rank.

Used by tests, benchmarks, ``zeppelin train`` and ``zeppelin demo``. The launcher knows each rank's
pid and exit status and reads a per-rank progress marker (progress.py: the last collective or step
each rank entered). When a rank fails, the error names the cause first (failure.py): a rank killed by
a signal or exiting non-zero, else a rank's own exception, else the rank that stopped making progress,
and where; peers' secondary errors ("Connection reset by peer", "Application timeout") come after.

No ports are guessed: the launcher holds the rendezvous store on a port the OS gives it (port 0), so
concurrent jobs cannot collide. Ranks first meet at a start barrier with a generous start-up timeout
(imports on a loaded machine are slow); ``timeout`` then bounds every collective, and the launcher
gives up when no rank has entered a collective for ``timeout + 60`` s.

Ranks die with their launcher: SIGTERM/SIGINT to the launcher stops every rank (SIGTERM, then SIGKILL
after a grace period) and raises :class:`LaunchInterrupted`; a SIGKILLed launcher is noticed by the
ranks through ``PR_SET_PDEATHSIG`` on Linux and a parent-pid watchdog everywhere, and they exit.

``fn(rank, world_size, *args)`` must be importable (module level) because children are spawned.
"""

from __future__ import annotations

import datetime
import os
import queue as _queue
import signal
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

import torch.multiprocessing as mp

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.distributed.failure import Diagnosis, diagnose
from megatron_zeppelin.distributed.progress import Board, install

GRACE_S = 5.0  # after the first failure, time for the other ranks' reports and exits to arrive
STOP_GRACE_S = 3.0  # SIGTERM, then SIGKILL after this long
START_TIMEOUT_S = 600.0  # all ranks up and at the start barrier (imports on a loaded machine)


class DistributedFailure(RuntimeError):
    """A run failed; ``diagnosis`` says which rank caused it and how (None for a launcher error)."""

    def __init__(self, message: str, diagnosis: Optional[Diagnosis] = None):
        super().__init__(message)
        self.diagnosis = diagnosis


class LaunchInterrupted(KeyboardInterrupt):
    """The launcher got SIGTERM or SIGINT; every rank was stopped. ``signum`` is the signal."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}: every rank was stopped")
        self.signum = signum


def _die_with_parent(ppid: int) -> None:
    """Exit when the launcher dies, even by SIGKILL: the kernel's parent-death signal on Linux, and a
    watchdog on the parent pid (other systems, or a parent that died before prctl ran)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch():
        while os.getppid() == ppid:
            time.sleep(0.5)
        os._exit(1)

    if os.getppid() != ppid:
        os._exit(1)
    threading.Thread(target=watch, name="zeppelin-parent-watchdog", daemon=True).start()


def _worker(fn, rank, world_size, port, backend, q, args, timeout, start_timeout, env, board, ppid):
    _die_with_parent(ppid)
    # Ctrl-C reaches the whole foreground process group: the launcher alone handles it and stops us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch
    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world_size)})
    os.environ.update(env or {})
    torch.set_num_threads(1)  # more ranks than cores: keep each rank to one thread
    install(board, rank)
    try:
        board.set_phase(rank, "start-up (waiting for every rank at the start barrier)")
        store = dist.TCPStore("127.0.0.1", port, is_master=False,
                              timeout=datetime.timedelta(seconds=max(start_timeout, timeout)))
        if store.add("zeppelin/started", 1) == world_size:
            store.set("zeppelin/go", "1")
        store.wait(["zeppelin/go"])
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        board.set_phase(rank, "")
        out = fn(rank, world_size, *args)
        q.put((rank, "ok", out))
    except ZeppelinError as e:  # a user error (bad flag or input): re-raised as itself in the parent
        try:
            q.put((rank, "user", (e, traceback.format_exc())))
        except Exception:  # an exception that does not pickle: report it as a failure
            q.put((rank, "err", traceback.format_exc()))
    except BaseException:  # noqa: BLE001 - report everything, including SystemExit from the body
        q.put((rank, "err", traceback.format_exc()))
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass


def stop_ranks(procs, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM every live rank, SIGKILL what is left after ``grace`` seconds, join all (a rank
    that never started, because starting an earlier one failed, is skipped: joining it would hide
    that error behind an AssertionError)."""
    procs = [p for p in procs if p.pid is not None]
    for p in procs:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + grace
    for p in procs:
        p.join(timeout=max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()


class _Signals:
    """While the launcher waits, SIGTERM/SIGINT raise LaunchInterrupted (main thread only)."""

    def __enter__(self):
        self.saved = {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self.saved[s] = signal.signal(s, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise LaunchInterrupted(signum)

    def __exit__(self, *exc):
        for s, h in self.saved.items():
            signal.signal(s, h)


def run_distributed(fn: Callable, world_size: int, *args: Any, timeout: float = 180.0,
                    backend: str = "gloo", env: Optional[Dict[str, str]] = None,
                    start_timeout: float = START_TIMEOUT_S) -> List[Any]:
    """Run ``fn`` on ``world_size`` spawned ranks; return the per-rank results in rank order.

    ``timeout`` bounds each collective (the process-group timeout) and the launcher's wait for any
    progress; ``start_timeout`` bounds start-up (spawn, imports) until every rank is at the barrier.
    """
    import torch.distributed as dist

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    board = Board(ctx, world_size)
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=max(timeout, 60)),
                          wait_for_workers=False)  # port 0: the OS picks a free one, no race with other jobs
    procs = [ctx.Process(target=_worker, name=f"zeppelin-rank-{r}",
                         args=(fn, r, world_size, store.port, backend, q, args, timeout, start_timeout, env,
                               board, os.getpid()), daemon=False)  # a rank may start helpers (checkpoint writers)
             for r in range(world_size)]
    results: Dict[int, Any] = {}
    errors: Dict[int, tuple] = {}
    exitcodes: Dict[int, int] = {}
    events: List[tuple] = []
    user_errors: Dict[int, BaseException] = {}
    failed_at: Optional[float] = None
    timed_out = ""
    t0 = time.monotonic()
    launched = time.time()
    with _Signals():
        try:
            for p in procs:
                p.start()
            while len(results) < world_size:
                try:
                    rank, status, payload = q.get(timeout=0.2)
                    if status == "ok":
                        results[rank] = payload
                    else:
                        if status == "user":
                            user_errors[rank], payload = payload
                        errors[rank] = (status, payload)
                        events.append(("error", rank))
                    continue  # drain the queue before looking at processes
                except _queue.Empty:
                    pass
                for r, p in enumerate(procs):
                    if r not in exitcodes and p.exitcode not in (None, 0):
                        exitcodes[r] = p.exitcode
                        events.append(("exit", r))
                now = time.monotonic()
                if events and failed_at is None:
                    failed_at = now
                if failed_at is not None:
                    settled = all(r in results or r in errors or procs[r].exitcode is not None
                                  for r in range(world_size))
                    if settled or now - failed_at > GRACE_S:
                        break
                    continue
                if not store.check(["zeppelin/go"]):
                    if now - t0 > start_timeout + 30:
                        timed_out = f"not every rank started within {start_timeout:.0f}s"
                        break
                elif time.time() - max(board.last_activity(), launched) > timeout + 60:
                    timed_out = f"no rank entered a collective for {timeout + 60:.0f}s"
                    break
        except LaunchInterrupted:
            stop_ranks(procs)
            raise
        finally:
            markers = [board.read(r) for r in range(world_size)]
            now_wall = time.time()
            if len(results) == world_size:  # every rank returned: let them finish exiting
                for p in procs:
                    p.join(timeout=30)
            stop_ranks(procs)
            q.close()
            del store
    if not events and not timed_out:
        return [results[r] for r in range(world_size)]
    d = diagnose(world_size, [p.pid for p in procs], exitcodes, errors, events, set(results), markers,
                 now_wall, timed_out=bool(timed_out))
    if d.kind == "exception" and d.rank in user_errors:
        raise user_errors[d.rank]  # the CLI prints it as one line
    msg = d.message() if not timed_out else f"{timed_out}: {d.message()}"
    raise DistributedFailure(msg, d)
