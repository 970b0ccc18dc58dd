"""Run a function on N local processes with torch.distributed, never hanging.

Used by tests, benchmarks and the CPU demo. Every process group gets a timeout; the parent waits with a
deadline; the first failing rank's traceback is raised in the parent and the other ranks are
terminated (they may be blocked in a collective with the dead rank); every process is joined.

``fn(rank, world_size, *args)`` must be importable (module level) because children are spawned.
"""

from __future__ import annotations

import datetime
import os
import queue as _queue
import socket
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

import torch.multiprocessing as mp

from ..errors import ZeppelinError


class DistributedFailure(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(fn, rank, world_size, port, backend, q, args, timeout, env):
    import torch
    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world_size)})
    os.environ.update(env or {})
    torch.set_num_threads(1)  # more ranks than cores: keep each rank to one thread
    try:
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
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
            from .executor import drain_relays
            drain_relays()  # relays of others' pieces may outlive this rank's last wait()
        except Exception:
            pass
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass


def run_distributed(fn: Callable, world_size: int, *args: Any, timeout: float = 180.0,
                    backend: str = "gloo", env: Optional[Dict[str, str]] = None) -> List[Any]:
    """Run ``fn`` on ``world_size`` spawned ranks; return the per-rank results in rank order."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(fn, r, world_size, port, backend, q, args, timeout, env),
                         daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    results: Dict[int, Any] = {}
    error: Optional[str] = None
    user_error: Optional[BaseException] = None
    deadline = time.monotonic() + timeout + 60  # process start-up and imports on top of the collectives
    try:
        while len(results) < world_size and error is None:
            left = deadline - time.monotonic()
            if left <= 0:
                error = f"timed out after {timeout + 60:.0f}s with ranks {sorted(set(range(world_size)) - set(results))} unfinished"
                break
            try:
                rank, status, payload = q.get(timeout=min(left, 1.0))
            except _queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in results]
                if dead:
                    # Give a dying rank a moment to flush its traceback to the queue.
                    try:
                        rank, status, payload = q.get(timeout=5.0)
                    except _queue.Empty:
                        error = f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode} and no traceback"
                        break
                else:
                    continue
            if status == "ok":
                results[rank] = payload
            elif status == "user":
                user_error, tb = payload
                error = f"rank {rank} failed:\n{tb}"
            else:
                error = f"rank {rank} failed:\n{payload}"
    finally:
        for p in procs:
            if error is not None and p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
        q.close()
    if user_error is not None:
        raise user_error  # the CLI prints it as one line; the child's traceback is in error
    if error is not None:
        raise DistributedFailure(error)
    return [results[r] for r in range(world_size)]
