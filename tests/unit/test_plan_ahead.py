"""integration/plan_ahead.py: each batch planned on a worker (a spawned process, or a thread) while
the one before it trains. The Plans taken are the run's Planner's own (the same digests), a planning
error surfaces where the step takes the Plan, dropped or never-submitted batches are planned in the
step, close() joins the worker; a dead worker process is an error naming the batch, and where no
process can start the thread plans instead, said once."""

import argparse
import multiprocessing
import os
import signal
import threading

import numpy as np
import pytest

from megatron_zeppelin.integration.args import add_zeppelin_args, config_from_args
from megatron_zeppelin.integration import plan_ahead as pa
from megatron_zeppelin.integration.plan_ahead import PlanAhead, PlannedBatches, Worker
from megatron_zeppelin.integration.plan_process import PlanAheadError
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner import Planner
from megatron_zeppelin.planner.types import PlanError
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.topology import Topology


def _planner(capacity=0):
    from megatron_zeppelin.spec.config import ZeppelinConfig
    prof = load_profile("a800")
    topo = Topology(2, 4, 4)
    return Planner(topo, prof, load_model("llama-7b"), ZeppelinConfig(gpus_per_node=4, capacity_tokens=capacity))


def _batches(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.lognormal(7.5, 1.3, int(rng.integers(5, 60))).clip(1, 30000).astype(int).tolist() for _ in range(n)]


def _workers():
    return ([t for t in threading.enumerate() if t.name.startswith("zeppelin-plan-ahead")]
            + [p for p in multiprocessing.active_children() if p.name == "zeppelin-plan-ahead"])


@pytest.mark.parametrize("worker", list(Worker))
def test_the_plans_taken_are_the_planners(worker):
    planner, batches = _planner(), _batches(6)
    ahead = PlanAhead(planner, worker=worker)
    got, from_worker = [], []
    try:
        for b in PlannedBatches(iter(batches), ahead, lengths_of=list):
            got.append(ahead.take(b))
            from_worker.append(ahead.ahead)
        assert ahead.worker == worker and ahead.fallback == ""  # no fallback: this worker planned them
    finally:
        ahead.close()
    want = [planner.plan(b) for b in batches]
    assert got == want and all(from_worker)
    assert [p.digest() for p in got] == [p.digest() for p in want]
    assert not _workers()  # joined


@pytest.mark.parametrize("worker", list(Worker))
def test_a_planning_error_is_raised_where_the_plan_is_taken_and_the_worker_goes_on(worker):
    planner = _planner(capacity=8000)
    ok, too_long = [3000, 2000, 1000], [9000] * 8  # 72,000 tokens over 8 ranks of 8,000: no plan holds them
    ahead = PlanAhead(planner, worker=worker)
    try:
        batches = PlannedBatches(iter([ok, too_long, ok]), ahead, lengths_of=list)
        assert ahead.take(next(batches)) == planner.plan(ok)
        with pytest.raises(PlanError):
            ahead.take(next(batches))
        assert ahead.take(next(batches)) == planner.plan(ok)
    finally:
        ahead.close()


@pytest.mark.parametrize("worker", list(Worker))
def test_dropped_and_unsubmitted_batches_are_planned_in_the_step(worker):
    planner, batches = _planner(), _batches(4, seed=1)
    ahead = PlanAhead(planner, keep=1, worker=worker)
    try:
        for b in batches:  # only the last stays queued
            ahead.submit(b)
        assert len(ahead._pending) == 1
        for k, b in enumerate(batches):
            assert ahead.take(b) == planner.plan(b)
            assert ahead.ahead == (k == len(batches) - 1)  # the dropped ones planned in the step
        assert ahead.take([500, 700]) == planner.plan([500, 700]) and not ahead.ahead
    finally:
        ahead.close()


def test_megatron_can_save_the_args_that_hold_it():
    import pickle
    ahead = PlanAhead(_planner())
    try:
        args = argparse.Namespace(seed=1, _zeppelin_plan_ahead=ahead)
        assert pickle.loads(pickle.dumps(args)) == argparse.Namespace(seed=1, _zeppelin_plan_ahead=None)
    finally:
        ahead.close()


def test_the_flag_reaches_the_config():
    p = add_zeppelin_args(argparse.ArgumentParser())
    assert config_from_args(p.parse_args([])).plan_ahead
    assert not config_from_args(p.parse_args(["--no-zeppelin-plan-ahead"])).plan_ahead


def test_the_worker_flag():
    p = add_zeppelin_args(argparse.ArgumentParser())
    assert Worker(p.parse_args([]).zeppelin_plan_ahead_worker) is Worker.PROCESS
    assert Worker(p.parse_args(["--zeppelin-plan-ahead-worker", "thread"]).zeppelin_plan_ahead_worker) is Worker.THREAD
    with pytest.raises(SystemExit):
        p.parse_args(["--zeppelin-plan-ahead-worker", "fork"])


def test_a_dead_worker_process_is_an_error_naming_the_batch():
    planner, batches = _planner(), _batches(2, seed=2)
    ahead = PlanAhead(planner, worker=Worker.PROCESS)
    try:
        ahead.submit(batches[0])
        assert ahead.take(batches[0]) == planner.plan(batches[0]) and ahead.ahead  # up and planning
        ahead.submit(batches[1])
        os.kill(ahead._proc.pid, signal.SIGKILL)
        with pytest.raises(PlanAheadError, match=rf"died with exit code -9 while planning batch #2 "
                                                 rf"\({len(batches[1])} documents, {sum(batches[1])} tokens\)"):
            ahead.take(batches[1])
    finally:
        ahead.close()
    assert not _workers()


class _Unpicklable:
    """A planner that cannot be sent to a process (it holds a lock)."""

    def __init__(self, planner):
        self.planner, self.lock = planner, threading.Lock()

    def plan(self, lengths):
        return self.planner.plan(lengths)


class _DiesInTheChild(_Unpicklable):
    """A planner whose copy kills the worker process as it is unpickled, before it is ready."""

    def __reduce__(self):
        return (os._exit, (3,))


@pytest.mark.parametrize("kind", [_Unpicklable, _DiesInTheChild])
def test_where_no_process_starts_a_thread_plans_said_once(kind, monkeypatch, capsys):
    monkeypatch.setattr(pa, "_SAID", [])
    planner, batches = _planner(), _batches(3, seed=3)
    ahead, again = PlanAhead(kind(planner), worker=Worker.PROCESS), None
    try:
        got = []
        for b in PlannedBatches(iter(batches), ahead, lengths_of=list):
            got.append(ahead.take(b))
        assert got == [planner.plan(b) for b in batches]
        assert ahead.worker is Worker.THREAD and ahead.fallback
        again = PlanAhead(kind(planner), worker=Worker.PROCESS)
        again.submit(batches[0])
        assert again.take(batches[0]) == planner.plan(batches[0]) and again.worker is Worker.THREAD
    finally:
        ahead.close()
        if again is not None:
            again.close()
    said = capsys.readouterr().err
    assert said.count("zeppelin plan-ahead: no worker process") == 1, said
    assert not _workers()
