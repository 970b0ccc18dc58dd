"""Checkpoints in Megatron's distributed checkpoint format, written atomically.

Layout (Megatron-LM's): ``DIR/iter_NNNNNNN/`` is a megatron-core ``dist_checkpointing`` checkpoint
(torch_dist) and ``DIR/latest_checkpointed_iteration.txt`` names the last complete one. The state dict
follows Megatron-LM's keys: ``model`` (the GPTModel's sharded state dict: the same keys as the stock
spec, so Megatron loads the weights with ``--ckpt-format torch_dist --no-load-optim --no-load-rng``),
``iteration``, ``checkpoint_version``, ``opt_param_scheduler``; the torch optimizer state (one shard per
tensor-parallel rank, replicated over data-parallel ranks) and each rank's RNG state are sharded
objects under ``zeppelin/``. The data order depends only on (seed, step), so the step restores the
batches: resuming reproduces the uninterrupted run bit for bit.

Atomic: every rank writes into ``iter_NNNNNNN.tmp``; after all have finished, rank 0 renames it to
``iter_NNNNNNN`` and only then replaces the marker (itself written to a temporary name, then renamed).
A rank killed mid-save leaves a ``.tmp`` directory that no marker points to; the next save of that step
removes it.
"""

from __future__ import annotations

import os
import shutil
from typing import Optional

import torch
import torch.distributed as dist

from megatron_zeppelin.errors import ZeppelinError

MARKER = "latest_checkpointed_iteration.txt"  # Megatron-LM's name for "the latest complete checkpoint"
CHECKPOINT_VERSION = 3.0  # Megatron-LM's version for dist checkpoints


class CheckpointError(ZeppelinError):
    pass


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"iter_{step:07d}")


def _ranks():
    from megatron.core import parallel_state as ps
    return (ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size(),
            ps.get_data_parallel_rank(), dist.get_rank(), dist.get_world_size())


def _sharded_state(model, optimizer, scheduler, step: int, extra: Optional[dict]) -> dict:
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    tp_rank, tp, dp_rank, rank, world = _ranks()
    return {"model": model.sharded_state_dict(),
            "iteration": step, "checkpoint_version": CHECKPOINT_VERSION,
            "opt_param_scheduler": scheduler.state_dict() if scheduler is not None else None,
            "zeppelin": {"extra": extra or {},
                         # AdamW over all-reduced grads: identical on data-parallel replicas
                         "optimizer": ShardedObject("zeppelin/optimizer", optimizer.state_dict(), (tp,), (tp_rank,),
                                                    replica_id=dp_rank),
                         "rng": ShardedObject("zeppelin/rng", torch.get_rng_state(), (world,), (rank,), replica_id=0)}}


def _write_marker(root: str, step: int) -> None:
    tmp = os.path.join(root, f".{MARKER}.tmp")
    with open(tmp, "w") as f:
        f.write(str(step))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(root, MARKER))


def _results_queue_in_process() -> None:
    """megatron-core's torch_dist writer collects write results through a ``Manager().Queue()``: a
    server process per rank that outlives a killed rank (an orphan) and costs a Python start-up. A
    synchronous save writes from this process (its writers are forked and joined here), so a queue of
    this process does the same job. A thread queue, not a ``multiprocessing.Queue``: the latter's put
    returns before its feeder thread has written, and megatron's finalize reads with ``get_nowait``,
    which then finds it empty on a loaded host ("results_queue should not be empty")."""
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async
    if getattr(filesystem_async, "_results_queue", "absent") is None:
        filesystem_async._results_queue = queue.Queue()


def save(root: str, step: int, model, optimizer, scheduler, extra: Optional[dict] = None) -> str:
    """Collective: all ranks write ``iter_<step>.tmp``, rank 0 renames it and updates the marker."""
    from megatron.core import dist_checkpointing

    from megatron_zeppelin.distributed import progress

    lead = dist.get_rank() == 0
    final = step_dir(root, step)
    tmp = final + ".tmp"
    if lead:
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left by a save that was killed
        os.makedirs(tmp)
    dist.barrier()
    progress.mark(f"saving checkpoint {tmp}")
    _results_queue_in_process()
    dist_checkpointing.save(_sharded_state(model, optimizer, scheduler, step, extra), tmp)
    dist.barrier()  # every rank's shards are on disk
    if lead:
        old = final + ".old"
        if os.path.exists(final):  # the same step saved again (a resumed run): keep it until replaced
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        _write_marker(root, step)  # last: the marker only ever names a complete checkpoint
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    progress.mark("")
    return final


def latest_step(root: str) -> int:
    p = os.path.join(root, MARKER)
    if not os.path.exists(p):
        raise CheckpointError(f"--load {root}: no checkpoint there (no {MARKER})")
    with open(p) as f:
        return int(f.read().strip())


def load(root: str, model, optimizer, scheduler, step: Optional[int] = None) -> dict:
    """Collective: restore model, optimizer, scheduler and RNG; returns ``{"step": last completed step}``."""
    from megatron.core import dist_checkpointing

    step = latest_step(root) if step is None else step
    d = step_dir(root, step)
    if not os.path.isdir(d):
        raise CheckpointError(f"--load {root}: {d} is missing")
    try:
        state = dist_checkpointing.load(_sharded_state(model, optimizer, scheduler, step, None), d)
    except Exception as e:  # noqa: BLE001 - a layout/shape mismatch surfaces here as many exception types
        raise CheckpointError(f"--load {root}: cannot load {d} into this model and parallel layout "
                              f"(was it saved with the same --model and --tensor-model-parallel-size?): {e}") from e
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["zeppelin"]["optimizer"])
    if scheduler is not None and state["opt_param_scheduler"] is not None:
        scheduler.load_state_dict(state["opt_param_scheduler"])
    torch.set_rng_state(state["zeppelin"]["rng"])
    return {"step": int(state["iteration"]), "extra": state["zeppelin"]["extra"]}
