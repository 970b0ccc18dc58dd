"""Helpers for the Megatron-LM tests: a real indexed dataset, the pretrain command, log parsing.

The runs use the second virtualenv made by scripts/setup.sh (``.venv-mlm``: megatron-core 0.19.2,
which ships ``megatron.training``), or the interpreter named by ``ZEPPELIN_MLM_PYTHON``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from typing import Dict, List, Optional

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "pretrain_gpt_zeppelin.py")
VOCAB = 128
SEQ = 64  # each rank's tokens per micro-batch
MAXPOS = 4 * SEQ  # longest document: spans up to 3 ranks


def mlm_python() -> Optional[str]:
    """The interpreter with megatron.training, or None."""
    py = os.environ.get("ZEPPELIN_MLM_PYTHON") or os.path.join(ROOT, ".venv-mlm", "bin", "python")
    return py if os.path.exists(py) else None


def build_dataset(prefix: str, n_docs: int = 160, seed: int = 0) -> str:
    """A Megatron indexed dataset (megatron-core's IndexedDatasetBuilder) of long-tailed documents:
    most short, some three ranks' shares long, so the planner must split them over rings."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    for i in range(n_docs):
        n = int(rng.choice([3 * SEQ + 1, rng.integers(2, 12), rng.integers(12, 40)], p=[0.15, 0.5, 0.35]))
        b.add_document(np.asarray(rng.integers(1, VOCAB, n), dtype=np.int32), [n])
    b.finalize(prefix + ".idx")
    return prefix


def model_flags(prefix: str) -> List[str]:
    """A tiny GPT on CPU (fused kernels off: they are CUDA-only)."""
    return ("--num-layers 2 --hidden-size 32 --num-attention-heads 4 --ffn-hidden-size 64 "
            f"--seq-length {SEQ} --max-position-embeddings {MAXPOS} --position-embedding-type rope "
            "--normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear "
            "--transformer-impl local --attention-dropout 0 --hidden-dropout 0 "
            "--no-bias-swiglu-fusion --no-bias-dropout-fusion --no-rope-fusion --no-gradient-accumulation-fusion "
            "--no-masked-softmax-fusion --no-persist-layer-norm "
            "--micro-batch-size 1 --lr 1e-3 --min-lr 1e-3 --lr-decay-style constant --clip-grad 1.0 --seed 1234 "
            f"--tokenizer-type NullTokenizer --vocab-size {VOCAB} --make-vocab-size-divisible-by 128 "
            f"--calculate-per-token-loss --dataloader-type external --data-path {prefix} --split 90,10,0 "
            "--distributed-backend gloo --distributed-timeout-minutes 5 --log-interval 1 --eval-interval 1000 --eval-iters 0 "
            "--log-throughput").split()


def run(py: str, ranks: int, flags: List[str], timeout: float, cwd: str, script: str = SCRIPT,
        env: Optional[dict] = None) -> str:
    """torchrun ``script`` on ``ranks`` gloo ranks (the whole process group is killed after
    ``timeout`` s); returns the combined log; a failure names the failed rank(s)."""
    env = dict(os.environ if env is None else env, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [py, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", script] + flags
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError(f"pretrain on {ranks} ranks timed out after {timeout:.0f} s:\n{out[-4000:]}")
    if p.returncode != 0:
        # the ranks that raised ([rankN]: Traceback) and torchrun's "Root Cause" rank
        root = re.search(r"Root Cause.*?rank\s*:\s*(\d+)", out, re.S)
        failed = sorted(set(re.findall(r"\[rank(\d+)\]: Traceback", out)) | ({root.group(1)} if root else set()))
        raise AssertionError(f"pretrain on {ranks} ranks failed (rc {p.returncode}; failed rank(s): "
                             f"{', '.join(failed) or 'unknown'}):\n{out[-6000:]}")
    return out


def interpreter_first(py: str, bin_dir: str, env: dict) -> dict:
    """``env`` with ``python3`` / ``python3-config`` of ``py`` first on PATH: a checkout's dataset
    Makefile builds its helpers with whatever ``python3`` PATH names (pybind11 and the extension
    suffix must be the run's interpreter's)."""
    os.makedirs(bin_dir, exist_ok=True)
    scripts = {"python3": f'exec {py} "$@"',  # a wrapper, not a link: a venv is found from its own path
               "python3-config": f"exec {py} -c \"import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))\""}
    for name, body in scripts.items():
        path = os.path.join(bin_dir, name)
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\n{body}\n")
        os.chmod(path, 0o755)
    return dict(env, PATH=bin_dir + os.pathsep + env.get("PATH", ""))


def scalars(tb_dir: str) -> Dict[str, Dict[int, float]]:
    """{'lm loss' | 'grad-norm': {iteration: value}} from Megatron's tensorboard events (the
    text log rounds the grad norm to 3 decimals)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: Dict[str, Dict[int, float]] = {"lm loss": {}, "grad-norm": {}}
    ea = EventAccumulator(tb_dir)
    ea.Reload()
    for tag in out:
        if tag in ea.Tags()["scalars"]:
            out[tag] = {e.step: e.value for e in ea.Scalars(tag)}
    return out


def plan_lines(log: str) -> List[str]:
    """Rank 0's ``zeppelin plan: ...`` lines (--zeppelin-debug-plan)."""
    return re.findall(r"zeppelin plan: [^\n]*", log)
