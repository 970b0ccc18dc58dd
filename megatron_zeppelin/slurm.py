"""SLURM jobs for a run matrix: Zeppelin and the stock Megatron baselines on the same model and data.

A matrix (YAML) has ``defaults`` and ``runs``; each run expands to one job per mode:

- ``zeppelin``: scripts/pretrain_gpt_zeppelin.py with ``--zeppelin-balance`` (plans every micro-batch);
- ``dp``: stock Megatron-LM pretrain_gpt.py, data parallel over packed samples (document masks);
- ``cp_p2p``: stock CP, ``--context-parallel-size N --cp-comm-type p2p`` (TE ring attention);
- ``cp_a2a_p2p``: stock hierarchical CP, ``--cp-comm-type a2a+p2p`` with
  ``--hierarchical-context-parallel-sizes <inside node> <across nodes>``.

>>> run = {"name": "7b-arxiv", "model": "llama-7b", "nodes": 2, "gpus_per_node": 8, "cp": 16,
...        "seq_length": 65536, "global_batch_tokens": "1M", "data_path": "/data/arxiv_text_document"}
>>> a = megatron_args(run, "cp_a2a_p2p")
>>> a[a.index("--cp-comm-type") + 1], a[a.index("--hierarchical-context-parallel-sizes") + 1:][:2]
('a2a+p2p', ['8', '2'])
>>> "--zeppelin-balance" in megatron_args(run, "zeppelin"), megatron_args(run, "dp")[-2:]
(True, ['--context-parallel-size', '1'])
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Dict, List, Sequence

import yaml

from .errors import ZeppelinError
from .model_spec import load_model
from .token_counts import parse_tokens  # one parser for every command

MODES = ("zeppelin", "dp", "cp_p2p", "cp_a2a_p2p")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE = os.path.join(REPO, "scripts", "slurm", "job.sbatch.tmpl")
ENV_SH = os.path.join(REPO, "scripts", "slurm", "env.sh")
DEFAULTS = {"gpus_per_node": 8, "tp": 1, "cp": 8, "seq_length": 65536, "global_batch_tokens": "1M",
            "train_iters": 50, "time": "01:00:00", "cluster": "h200", "modes": list(MODES),
            "tokenizer_type": "GPT2BPETokenizer", "tokenizer_args": [], "megatron_lm": "$MEGATRON_LM",
            "log_dir": "logs", "sbatch": {}, "env": {}, "extra_args": []}


class SlurmError(ZeppelinError):
    pass


def megatron_args(run: Dict, mode: str) -> List[str]:
    r = {**DEFAULTS, **run}
    m = load_model(r["model"])
    seq = parse_tokens(r["seq_length"])
    gb = max(1, parse_tokens(r["global_batch_tokens"]) // seq)
    tp, cp, g = int(r["tp"]), int(r["cp"]), int(r["gpus_per_node"])
    a = ["--num-layers", m.layers, "--hidden-size", m.hidden, "--num-attention-heads", m.heads,
         "--ffn-hidden-size", m.ffn, "--seq-length", seq, "--max-position-embeddings", seq,
         "--micro-batch-size", 1, "--global-batch-size", gb, "--bf16", "--swiglu",
         "--normalization", "RMSNorm", "--position-embedding-type", "rope",
         "--untie-embeddings-and-output-weights", "--disable-bias-linear",
         "--attention-dropout", 0, "--hidden-dropout", 0, "--tensor-model-parallel-size", tp,
         "--use-distributed-optimizer", "--overlap-grad-reduce", "--calculate-per-token-loss",
         "--data-path", r["data_path"], "--split", "100,0,0", "--tokenizer-type", r["tokenizer_type"],
         *r["tokenizer_args"], "--train-iters", r["train_iters"], "--lr", "3e-4", "--min-lr", "3e-5",
         "--lr-decay-style", "cosine", "--lr-warmup-iters", 2, "--clip-grad", "1.0", "--log-interval", 1,
         "--eval-iters", 0, "--log-throughput"]
    if m.kv_heads != m.heads:
        a += ["--group-query-attention", "--num-query-groups", m.kv_heads]
    if tp > 1 and mode != "zeppelin":  # Zeppelin's layer spec does not support sequence parallelism yet
        a += ["--sequence-parallel"]
    a += list(r["extra_args"])
    if mode == "zeppelin":
        a += ["--zeppelin-balance", "--zeppelin-cluster", r["cluster"], "--zeppelin-gpus-per-node", g]
    elif mode == "dp":
        a += ["--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss", "--context-parallel-size", 1]
    elif mode in ("cp_p2p", "cp_a2a_p2p"):
        a += ["--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"]
        world = int(r["nodes"]) * g // tp
        if cp < 2 or world % cp:
            raise SlurmError(f"run {r['name']}: cp {cp} must be >= 2 and divide the {world} DPxCP ranks")
        a += ["--context-parallel-size", cp, "--cp-comm-type", "p2p" if mode == "cp_p2p" else "a2a+p2p"]
        if mode == "cp_a2a_p2p":
            inner = min(cp, g // tp)
            if cp % inner:
                raise SlurmError(f"run {r['name']}: cp {cp} is not a multiple of the {inner} ranks in a node")
            a += ["--hierarchical-context-parallel-sizes", inner, cp // inner]
    else:
        raise SlurmError(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
    return [str(x) for x in a]


@dataclass(frozen=True)
class Job:
    name: str
    mode: str
    path: str
    script: str
    log_dir: str


def load_matrix(path: str) -> Dict:
    if not os.path.exists(path):
        raise SlurmError(f"matrix file {path} not found (pass --matrix FILE)")
    with open(path) as f:
        d = yaml.safe_load(f) or {}
    if not isinstance(d, dict) or not isinstance(d.get("runs"), list) or not d["runs"]:
        raise SlurmError(f"{path}: a matrix needs a non-empty `runs:` list (and optional `defaults:`)")
    return d


def render_jobs(matrix_path: str, out_dir: str) -> List[Job]:
    d = load_matrix(matrix_path)
    with open(TEMPLATE) as f:
        tmpl = f.read()
    jobs = []
    for i, run in enumerate(d["runs"]):
        r = {**DEFAULTS, **(d.get("defaults") or {}), **run}
        for key in ("name", "model", "nodes", "data_path"):
            if key not in r:
                raise SlurmError(f"{matrix_path}: run {i} lacks `{key}`")
        for mode in r["modes"]:
            args = megatron_args(r, mode)
            entry = (os.path.join(REPO, "scripts", "pretrain_gpt_zeppelin.py") if mode == "zeppelin"
                     else os.path.join(str(r["megatron_lm"]), "pretrain_gpt.py"))
            job_name = f"{r['name']}-{mode}"
            script = tmpl.format(
                matrix=os.path.basename(matrix_path), name=r["name"], mode=mode, job_name=job_name,
                nodes=r["nodes"], gpus_per_node=r["gpus_per_node"], time=r["time"], log_dir=r["log_dir"],
                sbatch_extra="\n".join(f"#SBATCH --{k}={v}" for k, v in (r["sbatch"] or {}).items()),
                env_sh=ENV_SH, env_exports="\n".join(f"export {k}={shlex.quote(str(v))}"
                                                     for k, v in (r["env"] or {}).items()),
                entry=entry, args=" \\\n".join("  " + " ".join(shlex.quote(x) for x in pair)
                                               for pair in _pairs(args)))
            path = os.path.join(out_dir, f"{job_name}.sbatch")
            jobs.append(Job(r["name"], mode, path, script, str(r["log_dir"])))
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
