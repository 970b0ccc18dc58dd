"""Every rendered job's flags pass Megatron-LM's own parse_args + validate_args (and the plugin's).

The stock CP jobs need Transformer Engine and GPUs to run, so they are checked here by the code
Megatron runs first: scripts/slurm/check_megatron_args.py in the python with megatron.training. A
flag Megatron rejects, or a global batch its micro-batch calculator cannot split, fails this test;
the last case proves the check can fail.
"""

import json
import os
import shlex
import subprocess

import pytest

from megatron_zeppelin.slurm.jobs import ENV_SH, render_jobs

from slurm_helpers import MLM_PYTHON, REPO, mlm_python_missing, write_documents

pytestmark = pytest.mark.slurm
CHECK = os.path.join(REPO, "scripts", "slurm", "check_megatron_args.py")
MATRICES = [os.path.join(REPO, "megatron_zeppelin", "presets", "runs", m) for m in ("slurm_example.yaml", "slurm_cpu.yaml")]


def _check(jobs, tmp_path):
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(jobs))
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "TORCHDYNAMO_DISABLE": "1"}
    # in the jobs' environment: the rendered scripts source env.sh before starting the ranks
    cmd = f"source {shlex.quote(ENV_SH)} && exec {shlex.quote(MLM_PYTHON)} {shlex.quote(CHECK)} {shlex.quote(str(path))}"
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=900, env=env)
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(jobs), f"rc {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return {x["job"]: x for x in results}


def _with_data(args, prefix):
    """``args`` with --data-path's words (a prefix, or a blend's weights and prefixes) as ``prefix``."""
    i = args.index("--data-path")
    j = next((k for k in range(i + 1, len(args)) if args[k].startswith("--")), len(args))
    return args[:i + 1] + [prefix] + args[j:]


def test_rendered_jobs_pass_megatron_validation(tmp_path):
    why = mlm_python_missing()
    if why:
        pytest.skip(why)
    # the matrices' data prefixes are placeholders (the example's) or made by the recipe (the CPU one's):
    # the plugin's validation reads the documents, so every job gets a real tiny dataset
    prefix = write_documents(str(tmp_path / "data" / "docs"))
    jobs = [{"name": j.name, "mode": j.mode, "args": _with_data(list(j.args), prefix), "world_size": j.world_size,
             "env": dict(j.env)}
            for m in MATRICES for j in render_jobs(m, str(tmp_path))]
    assert {j["mode"] for j in jobs} >= {"zeppelin", "dp", "cp_p2p", "cp_a2a_p2p", "cp_all_gather"}
    # a job Megatron must reject: 16 samples cannot be split over 32 DP ranks
    bad = dict(jobs[0], name="bad-batch", args=[*jobs[0]["args"], "--global-batch-size", "16"])
    results = _check(jobs + [bad], tmp_path)
    failed = {k: v["error"] for k, v in results.items() if not v["ok"] and k != "bad-batch-zeppelin"}
    assert not failed, json.dumps(failed, indent=1)
    assert not results["bad-batch-zeppelin"]["ok"]
    assert "data_parallel_size (32)" in results["bad-batch-zeppelin"]["error"]
