"""integration/plan_share.py on gloo ranks: one rank of each domain plans, the others receive.

Each rank takes every batch's Plan from its domain's planning rank (plan-ahead on, the process or
the thread worker) and it is the Plan the rank would make itself (same digest, same value); a batch
never submitted is shared in the step; receiving ranks start no worker. A planner error, a dead
worker process and a planning rank that never answers each fail every rank with an error naming the
planning rank and the batch; the ranks never hang (every collective has the launcher's timeout, the
sharing group its own, every rank is joined).
"""

import os
import signal
import time
from datetime import timedelta

import numpy as np
import pytest

from megatron_zeppelin.distributed.launch import run_distributed
from megatron_zeppelin.integration.plan_ahead import PlannedBatches, Worker
from megatron_zeppelin.integration.plan_share import PlanShareError, SharedPlanAhead, share_group

TIMEOUT = 300  # the launcher's collectives (a loaded 2-core host imports slowly)


def _planner(ranks, capacity=0):
    from megatron_zeppelin.planner import Planner
    from megatron_zeppelin.spec.config import ZeppelinConfig
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.spec.model import load_model
    from megatron_zeppelin.spec.topology import Topology
    topo = Topology(max(1, ranks // 2), min(2, ranks), 2)
    return Planner(topo, load_profile("a800"), load_model("llama-7b"),
                   ZeppelinConfig(gpus_per_node=2, capacity_tokens=capacity, relay_chunk_bytes=0))


def _batches(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.lognormal(7.5, 1.3, int(rng.integers(5, 40))).clip(1, 30000).astype(int).tolist() for _ in range(n)]


def _domains(rank, world, size):
    first = rank // size * size
    return list(range(first, first + size))


def _share_and_compare(rank, world, size, worker, n):
    import multiprocessing

    import torch.distributed as dist

    from megatron_zeppelin.integration.plan_check import check_plan_agreement

    share = share_group(_domains(rank, world, size), timedelta(seconds=120))
    planner, batches = _planner(size), _batches(n, seed=7)
    ahead = SharedPlanAhead(planner, share, worker=worker)
    got, flags = [], []
    try:
        workers = [p.name for p in multiprocessing.active_children() if p.name == "zeppelin-plan-ahead"]
        for b in PlannedBatches(iter(batches), ahead, lengths_of=list):
            got.append(ahead.take(b))
            flags.append(ahead.ahead)
        late = [900, 300, 2500, 40]  # never submitted: shared in the step
        got.append(ahead.take(late))
        flags.append(ahead.ahead)
        batches.append(late)
        if size == world:  # plan_check's comparison still holds (on the default group: the
            check_plan_agreement(got[-1])  # sharing group is its thread's alone)
        worker_used, fallback = str(ahead.worker), ahead.fallback
    finally:
        ahead.close()
    own = [planner.plan(b) for b in batches]  # what this rank would have planned itself
    dist.barrier()
    return {"same": [g == o for g, o in zip(got, own)], "digests": [g.digest() for g in got],
            "own": [o.digest() for o in own], "ahead": flags, "workers": workers, "planning": share.planning,
            "src": share.src, "worker": worker_used, "fallback": fallback}


@pytest.mark.parametrize("size,worker", [(4, Worker.PROCESS), (2, Worker.THREAD)],
                         ids=["one-domain-of-4-process", "two-domains-of-2-thread"])
def test_every_rank_gets_the_plan_it_would_make(size, worker):
    res = run_distributed(_share_and_compare, 4, size, worker.value, 4, timeout=TIMEOUT)
    for rank, r in enumerate(res):
        assert r["src"] == rank // size * size and r["planning"] == (rank % size == 0)
        assert all(r["same"]) and r["digests"] == r["own"], (rank, r)
        assert r["ahead"] == [True] * 4 + [False], (rank, r["ahead"])
        # only the planning rank plans: receivers start no worker process
        assert r["workers"] == (["zeppelin-plan-ahead"] if r["planning"] and worker is Worker.PROCESS else []), r
        if r["planning"]:
            assert r["worker"] == worker.value and r["fallback"] == "", r
    # the domains planned their own batches (a 2-rank domain's plans are not a 4-rank one's)
    assert res[0]["digests"] == res[size - 1]["digests"]


def _planner_error(rank, world, worker):
    import torch.distributed as dist

    share = share_group(range(world), timedelta(seconds=120))
    planner = _planner(world, capacity=8000)
    ok, too_long = [3000, 2000, 1000], [9000] * 4  # 36,000 tokens over 4 ranks of 8,000: no plan holds them
    ahead = SharedPlanAhead(planner, share, worker=worker)
    out = {}
    try:
        batches = PlannedBatches(iter([ok, too_long, ok]), ahead, lengths_of=list)
        out["first"] = ahead.take(next(batches)) == planner.plan(ok)
        try:
            ahead.take(next(batches))
            out["error"] = None
        except PlanShareError as e:
            out["error"] = str(e)
        out["after"] = ahead.take(next(batches)) == planner.plan(ok)  # the domain goes on
    finally:
        ahead.close()
    dist.barrier()
    return out


@pytest.mark.parametrize("worker", list(Worker))
def test_a_planner_error_reaches_every_rank_naming_the_planning_rank(worker):
    res = run_distributed(_planner_error, 4, worker.value, timeout=TIMEOUT)
    for rank, r in enumerate(res):
        assert r["first"] and r["after"], (rank, r)
        assert r["error"] and "planning rank 0" in r["error"] and "batch #2 (4 documents, 36000 tokens)" in r["error"], \
            (rank, r["error"])
        assert "PlanError" in r["error"], r["error"]  # the planner's own error, passed on


def _dead_worker(rank, world):
    import torch.distributed as dist

    share = share_group(range(world), timedelta(seconds=120))
    planner, (a, b) = _planner(world), _batches(2, seed=3)
    ahead = SharedPlanAhead(planner, share, worker=Worker.PROCESS)
    out = {}
    try:
        ahead.submit(a)
        ahead.take(a)
        if share.planning:  # the worker dies before it plans the next batch
            os.kill(ahead._proc.pid, signal.SIGKILL)
            ahead._proc._proc.join(30)
        ahead.submit(b)
        try:
            ahead.take(b)
            out["error"] = None
        except PlanShareError as e:
            out["error"] = str(e)
    finally:
        ahead.close()
    dist.barrier()
    return out


def test_a_dead_worker_on_the_planning_rank_fails_every_rank_naming_it():
    res = run_distributed(_dead_worker, 4, timeout=TIMEOUT)
    for rank, r in enumerate(res):
        assert r["error"] and "planning rank 0" in r["error"] and "batch #2" in r["error"], (rank, r)
        assert "died" in r["error"], r["error"]  # plan_process's PlanAheadError, passed on


class _Stuck:
    """A planner that never answers within the sharing group's timeout."""

    def __init__(self, s):
        self.s = s

    def plan(self, lengths):
        time.sleep(self.s)
        raise RuntimeError("too late")


def _silent_planning_rank(rank, world, timeout_s):
    share = share_group(range(world), timedelta(seconds=timeout_s))
    ahead = SharedPlanAhead(_Stuck(3 * timeout_s), share, worker=Worker.THREAD)
    t0 = time.monotonic()
    try:
        ahead.submit([100, 200])
        try:
            ahead.take([100, 200])
            err = None
        except PlanShareError as e:
            err = str(e)
    finally:
        ahead.close()
    return {"error": err, "seconds": time.monotonic() - t0}


def test_a_receiving_rank_that_times_out_names_the_rank_it_waited_for():
    res = run_distributed(_silent_planning_rank, 3, 5, timeout=TIMEOUT)
    for rank, r in enumerate(res[1:], 1):
        assert r["error"] and f"rank {rank} received no Plan for batch #1 (2 documents, 300 tokens) from planning " \
                              "rank 0" in r["error"] and "within the group's timeout of 5 s" in r["error"], (rank, r)
        assert r["seconds"] < 60, r  # the group's 5 s timeout, not the launcher's
    assert res[0]["error"], res[0]  # the planning rank's own batch failed too
