"""Printed Megatron command lines (``zeppelin advise``'s, docs/'s) as jobs for
scripts/slurm/check_megatron_args.py: Megatron-LM's own parse_args + validate_args (+ the plugin's
validation for a Zeppelin line) in the Megatron-LM python, with the data placeholder replaced by a
real indexed dataset."""

import json
import os
import shlex
import subprocess

from slurm_helpers import MLM_PYTHON, REPO

CHECK = os.path.join(REPO, "scripts", "slurm", "check_megatron_args.py")
PLACEHOLDERS = ("PREFIX",)  # what a printed line leaves for the user's --data-path


def job_from_line(line: str, name: str, prefix: str, gpu_arch: int = 9) -> dict:
    """``[ENV=V ...] torchrun --nnodes N --nproc-per-node G SCRIPT.py|-m MODULE FLAGS...`` as a job: the
    flags after the entry (the placeholder, or ``--mock-data``, becomes ``--data-path prefix``), N x G ranks, the
    line's environment."""
    words = shlex.split(line)
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    assert words[0] == "torchrun", line
    # the entry: a script (SCRIPT.py) or a module (-m MODULE)
    script = next(i + (w == "-m") for i, w in enumerate(words) if w.endswith(".py") or w == "-m")
    launcher, flags = words[1:script], words[script + 1:]
    nodes = int(launcher[launcher.index("--nnodes") + 1]) if "--nnodes" in launcher else 1
    world = nodes * int(launcher[launcher.index("--nproc-per-node") + 1])
    flags = [prefix if f in PLACEHOLDERS else f for f in flags]
    if "--mock-data" in flags:
        i = flags.index("--mock-data")
        flags[i:i + 1] = ["--data-path", prefix]
    mode = "zeppelin" if "--zeppelin-balance" in flags else "stock"
    return {"name": name, "mode": mode, "args": flags, "world_size": world, "env": env, "gpu_arch": gpu_arch,
            "line": line}


def check_jobs(jobs, tmp_path) -> dict:
    """{job name-mode: {"ok", "error"}} from one run of the check in the Megatron-LM python (the
    caller's environment without CUDA_DEVICE_MAX_CONNECTIONS: each line brings its own)."""
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    env.update(PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), TORCHDYNAMO_DISABLE="1")
    r = subprocess.run([MLM_PYTHON, CHECK, str(path)], capture_output=True, text=True, timeout=900, env=env)
    results = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert len(results) == len(jobs), f"rc {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return {x["job"]: x for x in results}
