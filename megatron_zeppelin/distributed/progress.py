"""Per-rank progress markers: the last collective (and training step) each rank entered.

The launcher creates one :class:`Board` in shared memory per job; each rank installs it at start-up.
Installing wraps the ``torch.distributed`` collectives of that rank's process so that entering one
writes ``"<op> at <file>:<line> (<function>)"`` and the time. When ranks stop, the launcher reads the
board: the rank whose marker is oldest is the one that stopped making progress, and its marker says
where. Writes are lock-free (one writer per slot, the reader only reports).

The board a rank writes to is process state, like logging's handlers: the launcher sets it once per
child (:func:`install`); :func:`mark_step` is a no-op in processes the launcher did not start.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from dataclasses import dataclass
from typing import Optional

_LABEL = 192
# collectives and point-to-point ops whose entry is recorded (those missing in a torch version are skipped)
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
               "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list",
               "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "send", "recv",
               "batch_isend_irecv", "init_process_group", "new_group")
# not isend / irecv: P2POp checks its op by identity (``op in (isend, irecv)``), so they stay unwrapped


@dataclass(frozen=True)
class Marker:
    rank: int
    label: str  # the last collective entered; "" before any
    phase: str  # the last named phase (mark), "" if none or the step started since
    step: int  # -1 before the first mark_step
    t: float  # time.time() of the last write, 0.0 if none

    def describe(self, now: float) -> str:
        if not self.t:
            return "never started (no marker)"
        where = [f"step {self.step}"] if self.step >= 0 else []
        where += [f"in {self.phase}"] if self.phase else []
        where += [f"last entered {self.label}"] if self.label else []
        return ", ".join(where) + f" ({now - self.t:.0f}s ago)"


class Board:
    """Shared per-rank slots: created in the launcher, passed to each spawned rank."""

    def __init__(self, ctx, world: int):
        self.world = world
        self.times = ctx.RawArray("d", world)
        self.steps = ctx.RawArray("q", [-1] * world)
        self.labels = ctx.RawArray("c", world * _LABEL)
        self.phases = ctx.RawArray("c", world * _LABEL)

    @staticmethod
    def _put(arr, rank: int, text: str) -> None:
        arr[rank * _LABEL:(rank + 1) * _LABEL] = text.encode("utf-8", "replace")[:_LABEL - 1].ljust(_LABEL, b"\0")

    @staticmethod
    def _get(arr, rank: int) -> str:
        return bytes(arr[rank * _LABEL:(rank + 1) * _LABEL]).split(b"\0", 1)[0].decode("utf-8", "replace")

    def write(self, rank: int, label: str) -> None:
        self._put(self.labels, rank, label)
        self.times[rank] = time.time()

    def set_phase(self, rank: int, phase: str) -> None:
        self._put(self.phases, rank, phase)
        self.times[rank] = time.time()

    def set_step(self, rank: int, step: int) -> None:
        self.steps[rank] = step
        self._put(self.phases, rank, "")
        self.times[rank] = time.time()

    def read(self, rank: int) -> Marker:
        return Marker(rank, self._get(self.labels, rank), self._get(self.phases, rank), int(self.steps[rank]),
                      float(self.times[rank]))

    def last_activity(self) -> float:
        return max(self.times[r] for r in range(self.world))


_mine: Optional[tuple] = None  # (board, rank) in a launched rank


def _site() -> str:
    """The first caller outside torch.distributed and this module: where the program entered the op."""
    f = sys._getframe(2)
    here = os.path.abspath(__file__)
    while f is not None:
        fn = f.f_code.co_filename
        if fn != here and f"torch{os.sep}distributed" not in fn:
            return f"{os.path.basename(fn)}:{f.f_lineno} ({f.f_code.co_name})"
        f = f.f_back
    return "?"


def _wrap(name: str, op):
    @functools.wraps(op)
    def entered(*args, **kwargs):
        if _mine is not None:
            _mine[0].write(_mine[1], f"{name} at {_site()}")
        return op(*args, **kwargs)
    entered.__zeppelin_progress__ = True
    return entered


def install(board: Board, rank: int) -> None:
    """In a launched rank: record every collective this process enters on ``board``."""
    global _mine
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    _mine = (board, rank)
    for mod in (dist, c10d):
        for name in COLLECTIVES:
            op = getattr(mod, name, None)
            if op is not None and not getattr(op, "__zeppelin_progress__", False):
                setattr(mod, name, _wrap(name, op))


def mark(phase: str) -> None:
    """Record the phase this rank is in (e.g. "saving checkpoint DIR"; "" = none) until the next
    mark or step; no-op outside a launched rank."""
    if _mine is not None:
        _mine[0].set_phase(_mine[1], phase)


def mark_step(step: int) -> None:
    """Record the training step this rank is in; no-op outside a launched rank."""
    if _mine is not None:
        _mine[0].set_step(_mine[1], step)
