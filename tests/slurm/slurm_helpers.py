"""What the SLURM tests share: the Megatron-LM python, the local cluster's script, a tiny dataset."""

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(REPO, "scripts", "slurm", "local-cluster.sh")
# A python with megatron-core >= 0.19 (megatron.training) and this package: scripts/setup.sh makes it.
MLM_PYTHON = os.environ.get("ZEPPELIN_MLM_PYTHON", os.path.join(REPO, ".venv-mlm", "bin", "python"))
EOD = 255  # NullTokenizer(vocab_size=256)'s end-of-document id


def mlm_python_missing() -> str:
    """Why the Megatron-LM python cannot be used ('' when it can)."""
    if not os.path.exists(MLM_PYTHON):
        return (f"no python with megatron.training at {MLM_PYTHON} (run scripts/setup.sh, or set "
                "ZEPPELIN_MLM_PYTHON)")
    r = subprocess.run([MLM_PYTHON, "-c", "import importlib.util as u, sys; "
                        "sys.exit(0 if u.find_spec('megatron.training') else 1)"],
                       capture_output=True, text=True, timeout=300)
    return "" if r.returncode == 0 else f"{MLM_PYTHON} has no megatron.training (megatron-core >= 0.19)"


def write_documents(prefix: str, n_docs: int = 400, seed: int = 0) -> str:
    """A Megatron indexed dataset of variable-length documents (long-tailed, 8..600 tokens), byte
    tokens below EOD and each document ending in EOD: what ``zeppelin slurm --tiny-data`` writes."""
    from megatron_zeppelin.integration.byte_documents import write_byte_documents

    return write_byte_documents(prefix, n_docs, seed)


def cpu_shim_missing() -> str:
    """Why megatron.training cannot train here ('' when it can): without CUDA, the jobs need the
    plugin's CPU shim for Megatron-LM's training loop."""
    import importlib.util

    import torch

    if torch.cuda.is_available() or importlib.util.find_spec("megatron_zeppelin.integration.cpu_megatron_lm"):
        return ""
    return "no CUDA and no CPU shim for megatron.training (megatron_zeppelin/integration/cpu_megatron_lm.py)"
