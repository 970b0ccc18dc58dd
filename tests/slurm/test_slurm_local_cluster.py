"""Real SLURM: the one-node cluster runs the rendered zeppelin and stock DP jobs of the CPU matrix.

The cluster (scripts/slurm/local-cluster.sh) is started for this module and stopped after it. The
test follows docs/slurm.md's recipe with the CPU matrix as shipped: from a submit directory that
holds the recipe's ``.venv-mlm`` (the matrix's relative ``python``), ``zeppelin slurm --tiny-data``
makes the matrix's ``data_path``, both jobs go through real ``sbatch`` (``zeppelin slurm --matrix``):
a tiny GPT trained by Megatron's own ``pretrain()`` on 4 gloo ranks (2 emulated nodes x 2), then
``zeppelin slurm --collect`` tabulates their tokens per second. Skipped, with the reason, where
slurmd cannot run or megatron.training is missing; a job that fails or overruns fails the test
with its log.
"""

import math
import os
import re
import subprocess
import time

import pytest
import yaml

from megatron_zeppelin.cli import main
from megatron_zeppelin.slurm.results import collect

from slurm_helpers import CLUSTER, MLM_PYTHON, REPO, cpu_shim_missing, mlm_python_missing

pytestmark = pytest.mark.slurm
CPU_MATRIX = os.path.join(REPO, "megatron_zeppelin", "presets", "runs", "slurm_cpu.yaml")
JOB_TIMEOUT_S = int(os.environ.get("ZEPPELIN_SLURM_JOB_TIMEOUT", "1500"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = mlm_python_missing() or cpu_shim_missing()
    if why:
        pytest.skip(why)
    if os.geteuid() != 0 and subprocess.run(["which", "slurmd"], capture_output=True).returncode:
        pytest.skip("slurmd is not installed and installing it needs root (apt-get install slurmd "
                    "slurmctld slurm-client munge)")
    state = str(tmp_path_factory.mktemp("slurm-cluster"))
    env = {**os.environ, "ZEPPELIN_SLURM_DIR": state}
    start = subprocess.run(["bash", CLUSTER, "start"], env=env, capture_output=True, text=True, timeout=900)
    if start.returncode:
        subprocess.run(["bash", CLUSTER, "stop"], env=env, capture_output=True, timeout=120)
        pytest.skip("slurmd cannot run here: " + " | ".join(start.stderr.strip().splitlines()[-3:]))
    try:
        yield {"SLURM_CONF": os.path.join(state, "slurm.conf"), "ZEPPELIN_SLURM_DIR": state}
    finally:
        stop = subprocess.run(["bash", CLUSTER, "stop"], env=env, capture_output=True, text=True, timeout=180)
        assert stop.returncode == 0, stop.stderr
        assert subprocess.run(["bash", CLUSTER, "status"], env=env, capture_output=True).returncode != 0


def _job_state(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    m = re.search(r"JobState=(\S+)", out)
    e = re.search(r"ExitCode=(\S+)", out)
    return f"{m.group(1) if m else 'UNKNOWN'} exit {e.group(1) if e else '?'}"


def _wait(job_ids, timeout_s):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        q = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)], capture_output=True, text=True)
        if not q.stdout.strip():
            return True
        time.sleep(5)
    subprocess.run(["scancel", *job_ids])
    return False


def _tail(path, n=40):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


def test_sbatch_zeppelin_and_stock_dp_jobs(cluster, tmp_path, monkeypatch, capsys):
    for k, v in cluster.items():
        monkeypatch.setenv(k, v)
    # the jobs inherit this environment (sbatch exports it): they import this tree's megatron_zeppelin
    monkeypatch.setenv("PYTHONPATH", REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(CPU_MATRIX) as f:
        matrix = yaml.safe_load(f)
    matrix_path = CPU_MATRIX
    venv = os.path.dirname(os.path.dirname(MLM_PYTHON))
    if matrix["defaults"]["python"] == ".venv-mlm/bin/python" and MLM_PYTHON == os.path.join(venv, "bin", "python"):
        os.symlink(venv, tmp_path / ".venv-mlm")  # the recipe's venv, where the matrix's relative path looks
    else:  # $ZEPPELIN_MLM_PYTHON is no venv's bin/python: name it in a copy of the matrix
        matrix["defaults"]["python"] = MLM_PYTHON
        matrix_path = str(tmp_path / "m.yaml")
        (tmp_path / "m.yaml").write_text(yaml.safe_dump(matrix))
    logs = tmp_path / matrix["defaults"]["log_dir"]
    monkeypatch.chdir(tmp_path)
    assert main(["slurm", "--tiny-data", matrix["runs"][0]["data_path"]]) == 0

    assert main(["slurm", "--matrix", matrix_path, "--out", str(tmp_path / "jobs")]) == 0
    out = capsys.readouterr().out
    ids = dict((mode, jid) for jid, mode in re.findall(r"Submitted batch job (\d+) \(\S+ (\S+)\)", out))
    assert set(ids) == {"zeppelin", "dp"}, out

    finished = _wait(list(ids.values()), JOB_TIMEOUT_S)
    states = {mode: _job_state(j) for mode, j in ids.items()}
    job_logs = {mode: next(iter(logs.glob(f"*-{mode}-{j}.log")), None) for mode, j in ids.items()}
    detail = "\n".join(f"--- {m} ({states[m]}): {p}\n{_tail(p) if p else '(no log)'}" for m, p in job_logs.items())
    assert finished, f"jobs still running after {JOB_TIMEOUT_S} s (cancelled)\n{detail}"
    assert all(s.startswith("COMPLETED") for s in states.values()), detail

    assert main(["slurm", "--collect", str(logs), "--warmup", "1", "--json", str(tmp_path / "r.json")]) == 0
    table = capsys.readouterr().out
    print(table)
    recs = {r["mode"]: r for r in collect(str(logs), warmup=1)}
    iters = matrix["defaults"]["train_iters"]
    for mode in ("zeppelin", "dp"):
        r = recs[mode]
        assert r["iterations"] == iters - 1 and r["tokens_per_iteration"] == 2048, (r, detail)
        assert r["tokens_per_s"] > 0 and math.isfinite(r["final_loss"]), (r, detail)
        assert re.search(rf"tiny-cpu\s+{mode}\s+\S+\s+[\d.]+\s+[\d.]+s", table), table


@pytest.mark.slow  # ~23 s with the cluster's teardown; the jobs above run on slurmd by default
def test_collect_names_a_failed_job(cluster, tmp_path, monkeypatch, capsys):
    """A job Megatron refuses (a flag it does not know) ends without iterations: --collect names it with
    Megatron's own error line and exits 1, instead of a row of n/a."""
    for k, v in cluster.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PYTHONPATH", REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.chdir(tmp_path)
    with open(CPU_MATRIX) as f:
        matrix = yaml.safe_load(f)
    assert main(["slurm", "--tiny-data", "data/docs"]) == 0
    matrix["defaults"].update(python=MLM_PYTHON, log_dir=str(tmp_path / "logs"), modes=["dp"],
                              extra_args=["--no-such-megatron-flag"])
    matrix["runs"][0]["data_path"] = "data/docs"
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(matrix))
    assert main(["slurm", "--matrix", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "jobs")]) == 0
    ids = re.findall(r"Submitted batch job (\d+)", capsys.readouterr().out)
    assert len(ids) == 1 and _wait(ids, JOB_TIMEOUT_S)
    assert main(["slurm", "--collect", str(tmp_path / "logs"), "--warmup", "1"]) == 1
    out, err = capsys.readouterr()
    assert "FAILED" in out and "tiny-cpu dp" in err and "--no-such-megatron-flag" in err, (out, err)
