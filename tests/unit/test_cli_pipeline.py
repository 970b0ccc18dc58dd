"""``zeppelin plan`` / ``simulate --pipeline-stages N`` (issue 52): the stages split the nodes, every
micro-batch is planned on one stage's DP ranks, and the iteration is the micro-batches in 1F1B
(planner/iteration.py one_f_one_b, read by the planner's Iteration and sim/iteration.py pipeline), its
bubble printed."""

import json
import re

import pytest

from megatron_zeppelin.cli import main
from megatron_zeppelin.planner.iteration import pipeline_s

# 2 nodes x 4 GPUs in 2 stages: each stage's 4 DP ranks plan 4K x 4 = 16K-token micro-batches; G 16 is 4.
PLAN = ["--model", "tiny", "--cluster", "h200", "--gpus-per-node", "4", "--dataset", "github", "--seq-length", "4K",
        "--micro-batch-size", "1", "--global-batch-size", "16"]
# simulate takes the profile's 8 GPUs per node: 8 DP ranks a stage, G 32 is 4 micro-batches
SIM = ["--model", "tiny", "--cluster", "h200", "--dataset", "github", "--seq-length", "4K",
       "--micro-batch-size", "1", "--global-batch-size", "32"]


def _run(capsys, tmp_path, cmd, argv, name):
    j = tmp_path / f"{name}.json"
    assert main([cmd, *argv, "--json", str(j)]) == 0
    return capsys.readouterr().out, json.loads(j.read_text())


def _bubble(out):
    line = next(x for x in out.splitlines() if x.startswith("pipeline: "))
    return line, float(re.search(r"bubble ([0-9.e+-]+) s", line).group(1))


def test_plan_pipeline_stages_run_the_stage_domains_steps_in_1f1b(capsys, tmp_path):
    flat, f = _run(capsys, tmp_path, "plan", PLAN + ["--nodes", "1"], "flat")
    out, p = _run(capsys, tmp_path, "plan", PLAN + ["--nodes", "2", "--pipeline-stages", "2"], "pp")
    it, one = p["strategies"]["zeppelin"]["iteration"], f["strategies"]["zeppelin"]["iteration"]
    # the same 4 micro-batches planned on the same 4-rank domain (one stage's node)
    assert p["gpus"]["domain_ranks"] == 4 and p["gpus"]["total"] == 8 and it["steps"] == 4
    assert it["digests"] == one["digests"] and it["step_predicted_s"] == one["step_predicted_s"]
    # ... run in 1F1B over 2 stages: half the layers each, a bubble, half the gradients to reduce
    steps = it["step_predicted_s"]
    assert it["allreduce_s"] == pytest.approx(one["allreduce_s"] / 2)
    assert it["predicted_s"] == pytest.approx(pipeline_s(steps, 2) + it["allreduce_s"])
    assert sum(steps) / 2 < it["predicted_s"] - it["allreduce_s"] < sum(steps)
    line, bubble = _bubble(out)
    assert "2 stages of 4 DP ranks each, 1F1B over 4 micro-batches" in line, line
    assert p["pipeline"]["bubble_s"] == pytest.approx(pipeline_s(steps, 2) - sum(steps) / 2)
    assert bubble == pytest.approx(p["pipeline"]["bubble_s"], rel=1e-3) and bubble > 0
    assert "pipeline:" not in flat


def test_simulate_pipeline_stages_show_the_bubble(capsys, tmp_path):
    flat, f = _run(capsys, tmp_path, "simulate", SIM + ["--nodes", "1"], "flat")
    out, p = _run(capsys, tmp_path, "simulate", SIM + ["--nodes", "2", "--pipeline-stages", "2"], "pp")
    assert p["pipeline_stages"] == 2 and p["step_digests"] == f["step_digests"]  # the same plans
    # the same work, summed over the whole model; the iteration is 1F1B over the stages
    assert p["forward_s"] == pytest.approx(f["forward_s"]) and p["backward_s"] == pytest.approx(f["backward_s"])
    stage = (p["forward_s"] + p["backward_s"]) / 2 + p["head_s"]  # the last stage: its layers and the head
    assert stage < p["iteration_s"] - p["allreduce_exposed_s"] < f["iteration_s"] - f["allreduce_exposed_s"]
    assert p["allreduce_exposed_s"] == pytest.approx(f["allreduce_exposed_s"] / 2)
    # the planner's prediction is its steps in the same 1F1B
    assert p["predicted_iteration_s"] == pytest.approx(pipeline_s(p["predicted_step_s"], 2) + p["allreduce_exposed_s"])
    line, bubble = _bubble(out)
    assert bubble == pytest.approx(p["iteration_s"] - stage - p["allreduce_exposed_s"], rel=1e-3, abs=1e-6)
    assert "pipeline:" not in flat


@pytest.mark.parametrize("cmd,argv,msg", [
    ("plan", PLAN + ["--nodes", "3", "--pipeline-stages", "2"], "--pipeline-stages 2 does not divide the job's 3 node(s)"),
    ("simulate", SIM + ["--nodes", "2", "--pipeline-stages", "0"], "--pipeline-stages must be >= 1"),
])
def test_pipeline_stages_that_cannot_split_the_nodes_are_refused(capsys, cmd, argv, msg):
    assert main([cmd, *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1, err
