"""The iteration as Megatron logs it (issue 56 item 5): with --global-batch-size G --micro-batch-size M
on R data-parallel ranks, plan and simulate report G / (M x R) planned steps, then the DP all-reduce,
with the step beside it."""

import json
import re

import pytest

from megatron_zeppelin.cli import main

# 8 ranks (2 nodes x 4 GPUs), 4K sequences: G 8 is one step, G 32 four; each step as sampled (data
# order: the default, rounds, regroups them; tests/unit/test_joint_accumulation.py)
BASE = ["--model", "tiny", "--cluster", "h200", "--gpus-per-node", "4", "--nodes", "2", "--dataset", "github",
        "--seq-length", "4K", "--micro-batch-size", "1", "--accumulation", "data_order"]
SIM = ["--model", "tiny", "--cluster", "a800", "--nodes", "1", "--dataset", "github", "--seq-length", "4K",
       "--micro-batch-size", "1", "--accumulation", "data_order"]  # simulate takes the profile's 8 GPUs per node: 8 ranks too


def _plan(capsys, tmp_path, gbs, *extra):
    j = tmp_path / f"plan{gbs}.json"
    assert main(["plan", *BASE, "--global-batch-size", str(gbs), "--json", str(j), *extra]) == 0
    return capsys.readouterr().out, json.loads(j.read_text())


def test_plan_iteration_is_its_steps_then_the_all_reduce(capsys, tmp_path):
    out1, one = _plan(capsys, tmp_path, 8)
    out4, four = _plan(capsys, tmp_path, 32)
    it1, it4 = one["strategies"]["zeppelin"]["iteration"], four["strategies"]["zeppelin"]["iteration"]
    assert it1["steps"] == 1 and it4["steps"] == 4
    # The first step is the same batch (seed 0) in both; the iteration of four adds three more steps.
    assert it4["step_predicted_s"][0] == pytest.approx(it1["step_predicted_s"][0])
    assert it4["predicted_s"] == pytest.approx(sum(it4["step_predicted_s"]) + it4["allreduce_s"])
    assert it4["predicted_s"] > 3 * it1["predicted_s"] - 3 * it1["allreduce_s"]
    assert len(set(it4["digests"])) == 4  # four different global micro-batches (successive seeds)
    line = next(x for x in out4.splitlines() if x.startswith("predicted iteration"))
    assert "4 gradient-accumulation steps (global micro-batches sampled with seeds 0..3" in line
    assert f"{it4['predicted_s']:.4g} s" in line and "all-reduce" in line
    assert "predicted step" in out4 and "1 step (the one above)" in out1


def test_plan_compare_prints_iteration_and_step(capsys, tmp_path):
    out, doc = _plan(capsys, tmp_path, 32, "--compare")
    z = doc["strategies"]["zeppelin"]["iteration"]
    assert "iteration s" in out and "step s" in out
    row = next(x for x in out.splitlines() if x.strip().startswith("zeppelin "))
    cells = row.split()
    assert float(cells[1]) == pytest.approx(z["predicted_s"], rel=1e-3)
    assert float(cells[2]) == pytest.approx(sum(z["step_predicted_s"]) / 4, rel=1e-3)


def test_plan_seeds_spread_over_whole_iterations(capsys, tmp_path):
    out, doc = _plan(capsys, tmp_path, 16, "--seeds", "2")
    assert "over 2 sampled iterations of 2 steps (seeds 0..3)" in out
    assert doc["seeds"]["steps_per_iteration"] == 2


def test_simulate_iteration_is_its_steps_then_the_all_reduce(capsys, tmp_path):
    res = {}
    for gbs in (8, 32):
        j = tmp_path / f"sim{gbs}.json"
        assert main(["simulate", *SIM, "--global-batch-size", str(gbs), "--json", str(j)]) == 0
        out = capsys.readouterr().out
        res[gbs] = (out, json.loads(j.read_text()))
    (out1, one), (out4, four) = res[8], res[32]
    assert one["steps"] == 1 and four["steps"] == 4
    assert four["predicted_step_s"][0] == pytest.approx(one["predicted_step_s"][0])
    # Four steps of compute, one all-reduce.
    assert four["allreduce_exposed_s"] == pytest.approx(one["allreduce_exposed_s"])
    assert four["iteration_s"] > 3 * (one["iteration_s"] - one["allreduce_exposed_s"])
    assert four["forward_s"] + four["head_s"] + four["backward_s"] + four["allreduce_exposed_s"] == \
        pytest.approx(four["iteration_s"], rel=1e-9)
    assert "4 gradient-accumulation steps, global micro-batches sampled with seeds 0..3" in out4
    step = float(re.search(r"\n  step +([0-9.]+) s", out4).group(1))
    assert step == pytest.approx((four["iteration_s"] - four["allreduce_exposed_s"]) / 4, abs=1e-4)
