"""SLURM jobs for a run matrix: Zeppelin and the stock Megatron baselines on the same model and data.

A matrix (YAML) has ``defaults`` and ``runs``; each run expands to one job per mode (the modes and
their flags: :mod:`megatron_zeppelin.slurm.args`). A job is an sbatch script rendered from
templates/job.sbatch.tmpl that sources templates/env.sh (package data of this package, so a wheel
install renders the same jobs) and starts the ranks one of two ways:

- ``launcher: torchrun`` (default): one ``torchrun`` per node (``srun --ntasks-per-node=1``);
- ``launcher: srun``: one SLURM task per rank (RANK / LOCAL_RANK / WORLD_SIZE from SLURM's ids).

``emulate_nodes: true`` runs the ``nodes x gpus_per_node`` ranks as tasks of one SLURM node (the
one-node cluster of scripts/slurm/local-cluster.sh); each rank's "node" is ``rank // gpus_per_node``,
as Zeppelin's topology reads it. ``device: cpu`` drops the GPU request and the CUDA-only flags.

>>> run = {"name": "r", "model": "tiny", "nodes": 2, "gpus_per_node": 2, "device": "cpu",
...        "emulate_nodes": True, "seq_length": 512, "global_batch_tokens": "2K", "data_path": "/d"}
>>> sbatch_lines(run)
['--job-name=JOB', '--nodes=1', '--ntasks=4', '--time=01:00:00', '--output=logs/JOB-%j.log']
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from importlib.resources import files
from typing import Dict, List, Sequence

from megatron_zeppelin.spec.yaml_load import safe_load

from megatron_zeppelin.presets import preset_dir
from megatron_zeppelin.slurm.args import (DEFAULTS as ARG_DEFAULTS, MODES, SlurmError, check_run, data_words,  # noqa: F401
                         megatron_args, parse_tokens, tokens_per_iteration)
from megatron_zeppelin.slurm.checks import interpreter, job_dir
from megatron_zeppelin.spec.entries import PACKED_ENTRY, ZEPPELIN_ENTRY, launch_args

# Package data, as paths on disk (the package is never zipped): the rendered job sources ENV_SH where
# the package is installed, so the compute nodes must see that install (as they must to run the entry).
TEMPLATE = str(files("megatron_zeppelin.slurm") / "templates" / "job.sbatch.tmpl")
ENV_SH = str(files("megatron_zeppelin.slurm") / "templates" / "env.sh")
LAUNCHERS = ("torchrun", "srun")
DEFAULTS = {**ARG_DEFAULTS, "megatron_lm": "$MEGATRON_LM", "python": "python", "launcher": "torchrun",
            "emulate_nodes": False, "log_dir": "logs", "sbatch": {}, "env": {}}


@dataclass(frozen=True)
class Job:
    name: str
    mode: str
    path: str
    script: str
    log_dir: str
    entry: str  # the training program after the launcher, as the script has it: ``-m MODULE`` or a path
    args: tuple  # the training flags
    world_size: int
    tokens_per_iteration: int
    env: tuple = ()  # the matrix's `env:` exports, (name, value) pairs
    # What must exist before sbatch (megatron_zeppelin.slurm.checks), as the job will look for it:
    python: str = "python"      # the ranks' interpreter as the matrix names it (the script: made absolute)
    data_path: tuple = ()       # --data-path's words (a prefix, or a blend's weights and prefixes)
    workdir: str = "."          # the job's working directory: relative paths resolve here
    entry_key: str = ""         # the matrix key that chose `entry` ('' for the plugin's own scripts)
    env_sh: str = ENV_SH        # the environment every job sources


def matrix_file(path: str) -> str:
    """The matrix file as given, else the preset of that bare name (``slurm_example``, ``slurm_cpu``:
    presets/runs/, found wherever the package is installed)."""
    name = path if path.endswith(".yaml") else path + ".yaml"
    preset = os.path.join(preset_dir("runs"), name)
    if not os.path.exists(path) and os.sep not in path and os.path.exists(preset):
        return preset
    return path


def load_matrix(path: str) -> Dict:
    path = matrix_file(path)
    if not os.path.exists(path):
        raise SlurmError(f"matrix file {path} not found (pass --matrix FILE)")
    with open(path) as f:
        d = safe_load(f) or {}
    if not isinstance(d, dict) or not isinstance(d.get("runs"), list) or not d["runs"]:
        raise SlurmError(f"{path}: a matrix needs a non-empty `runs:` list (and optional `defaults:`)")
    return d


def entry_of(run: Dict, mode: str) -> List[str]:
    """The training program, as the launcher's arguments: Zeppelin's entry module; for stock modes the
    checkout's pretrain_gpt.py, or, with ``megatron_lm`` empty, the packed entry module
    (pretrain_gpt.py's GPT path on megatron-core >= 0.19's megatron.training, for installs without a
    Megatron-LM checkout). The modules ship in the package (spec/entries.py)."""
    if mode == "zeppelin":
        return launch_args(ZEPPELIN_ENTRY)
    if not run.get("megatron_lm"):
        return launch_args(PACKED_ENTRY)
    return [os.path.join(str(run["megatron_lm"]), "pretrain_gpt.py")]


def sbatch_lines(run: Dict) -> List[str]:
    """The ``#SBATCH`` options of the run's jobs (job name and log name as JOB)."""
    r = {**DEFAULTS, **run}
    nodes, g = int(r["nodes"]), int(r["gpus_per_node"])
    if r["emulate_nodes"]:
        lines = ["--nodes=1", f"--ntasks={nodes * g}"]
    elif r["launcher"] == "srun":
        lines = [f"--nodes={nodes}", f"--ntasks-per-node={g}"]
    else:
        lines = [f"--nodes={nodes}", "--ntasks-per-node=1"]
    if r["device"] == "gpu":
        lines.append(f"--gpus-per-node={g}")
    lines += [f"--time={r['time']}", f"--output={r['log_dir']}/JOB-%j.log"]
    lines += [f"--{k}={v}" for k, v in (r["sbatch"] or {}).items()]
    return ["--job-name=JOB"] + lines


def render_jobs(matrix_path: str, out_dir: str, submit_dir: str = "") -> List[Job]:
    """The jobs of a matrix, as ``sbatch`` called from ``submit_dir`` (default: here) will run them:
    a relative ``python`` is made absolute against the job's directory."""
    d = load_matrix(matrix_path)
    submit_dir = os.path.abspath(submit_dir or os.getcwd())
    with open(TEMPLATE) as f:
        tmpl = f.read()
    jobs = []
    for i, run in enumerate(d["runs"]):
        r = {**DEFAULTS, **(d.get("defaults") or {}), **run}
        for key in ("name", "model", "nodes", "data_path"):
            if key not in r:
                raise SlurmError(f"{matrix_path}: run {i} lacks `{key}`")
        if r["launcher"] not in LAUNCHERS:
            raise SlurmError(f"run {r['name']}: launcher {r['launcher']!r} is not one of {', '.join(LAUNCHERS)}")
        check_run(r)
        tokens = tokens_per_iteration(r)
        world = int(r["nodes"]) * int(r["gpus_per_node"])
        workdir = job_dir(r, submit_dir)
        for mode in r["modes"]:
            args = megatron_args(r, mode)
            entry = " ".join(entry_of(r, mode))  # unquoted: a megatron_lm path may be $MEGATRON_LM
            job_name = f"{r['name']}-{mode}"
            launch = "zeppelin_srun" if (r["emulate_nodes"] or r["launcher"] == "srun") else "zeppelin_launch"
            script = tmpl.format(
                matrix=os.path.basename(matrix_path), name=r["name"], mode=mode,
                sbatch="\n".join("#SBATCH " + x.replace("JOB", job_name) for x in sbatch_lines(r)),
                nodes=r["nodes"], gpus_per_node=r["gpus_per_node"], tokens=tokens, world=world,
                env_sh=ENV_SH, python=interpreter(r["python"], workdir),
                env_exports="\n".join(f"export {k}={shlex.quote(str(v))}" for k, v in (r["env"] or {}).items()),
                launch=launch, entry=entry,
                args=" \\\n".join("  " + " ".join(shlex.quote(x) for x in pair) for pair in _pairs(args)))
            path = os.path.join(out_dir, f"{job_name}.sbatch")
            jobs.append(Job(r["name"], mode, path, script, str(r["log_dir"]), entry, tuple(args), world, tokens,
                            tuple((str(k), str(v)) for k, v in (r["env"] or {}).items()), python=str(r["python"]),
                            data_path=tuple(data_words(r["data_path"])), workdir=workdir,
                            entry_key="megatron_lm" if (mode != "zeppelin" and r.get("megatron_lm")) else ""))
    return jobs


def _pairs(args: Sequence[str]) -> List[List[str]]:
    """Group ``--flag value...`` for one flag a line."""
    out: List[List[str]] = []
    for a in args:
        if a.startswith("--") or not out:
            out.append([a])
        else:
            out[-1].append(a)
    return out
