"""integration/plan_ahead.py: each batch planned on a worker thread while the one before it trains.
The Plans taken are the run's Planner's own, a planning error surfaces where the step takes the
Plan, dropped or never-submitted batches are planned in the step, and close() joins the worker."""

import argparse
import threading

import numpy as np
import pytest

from megatron_zeppelin.integration.args import add_zeppelin_args, config_from_args
from megatron_zeppelin.integration.plan_ahead import PlanAhead, PlannedBatches
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
    return [t for t in threading.enumerate() if t.name.startswith("zeppelin-plan-ahead")]


def test_the_plans_taken_are_the_planners():
    planner, batches = _planner(), _batches(6)
    ahead = PlanAhead(planner)
    got, from_worker = [], []
    try:
        for b in PlannedBatches(iter(batches), ahead, lengths_of=list):
            got.append(ahead.take(b))
            from_worker.append(ahead.ahead)
    finally:
        ahead.close()
    want = [planner.plan(b) for b in batches]
    assert got == want and all(from_worker)
    assert not _workers()  # joined


def test_a_planning_error_is_raised_where_the_plan_is_taken_and_the_worker_goes_on():
    planner = _planner(capacity=8000)
    ok, too_long = [3000, 2000, 1000], [9000] * 8  # 72,000 tokens over 8 ranks of 8,000: no plan holds them
    ahead = PlanAhead(planner)
    try:
        batches = PlannedBatches(iter([ok, too_long, ok]), ahead, lengths_of=list)
        assert ahead.take(next(batches)) == planner.plan(ok)
        with pytest.raises(PlanError):
            ahead.take(next(batches))
        assert ahead.take(next(batches)) == planner.plan(ok)
    finally:
        ahead.close()


def test_dropped_and_unsubmitted_batches_are_planned_in_the_step():
    planner, batches = _planner(), _batches(4, seed=1)
    ahead = PlanAhead(planner, keep=1)
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
