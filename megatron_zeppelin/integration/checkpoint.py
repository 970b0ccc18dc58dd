"""Checkpoints: save at step k, resume, and the next losses equal the uninterrupted run.

One file per rank (model shard, optimizer and LR-scheduler state, CPU RNG state) under
``DIR/iter_NNNNNNN/``, and ``DIR/latest`` naming the last complete step. The data order depends only
on (seed, step), so restoring the step restores the batches.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import torch.distributed as dist

from ..errors import ZeppelinError


class CheckpointError(ZeppelinError):
    pass


def _dir(root: str, step: int) -> str:
    return os.path.join(root, f"iter_{step:07d}")


def save(root: str, step: int, model, optimizer, scheduler, extra: Optional[dict] = None) -> str:
    """Collective: every rank writes its file, then rank 0 updates ``latest``."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    d = _dir(root, step)
    os.makedirs(d, exist_ok=True)
    state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict() if scheduler is not None else None,
             "rng": torch.get_rng_state(), "extra": extra or {}}
    tmp = os.path.join(d, f".rank_{rank:04d}.pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, os.path.join(d, f"rank_{rank:04d}.pt"))
    if dist.is_initialized():
        dist.barrier()
    if rank == 0:
        with open(os.path.join(root, "latest.tmp"), "w") as f:
            f.write(str(step))
        os.replace(os.path.join(root, "latest.tmp"), os.path.join(root, "latest"))
    return d


def latest_step(root: str) -> int:
    p = os.path.join(root, "latest")
    if not os.path.exists(p):
        raise CheckpointError(f"--load {root}: no checkpoint there (no 'latest' file)")
    with open(p) as f:
        return int(f.read().strip())


def load(root: str, model, optimizer, scheduler, step: Optional[int] = None) -> dict:
    """Restore this rank's state; returns the saved dict (``step`` = last completed step)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    step = latest_step(root) if step is None else step
    path = os.path.join(_dir(root, step), f"rank_{rank:04d}.pt")
    if not os.path.exists(path):
        raise CheckpointError(f"--load {root}: {path} is missing (was it saved with the same number of ranks?)")
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    return state
