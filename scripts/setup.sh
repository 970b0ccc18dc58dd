#!/usr/bin/env bash
# Set up megatron_zeppelin in .venv (project root). On a machine without an NVIDIA GPU the CPU build
# of torch 2.13.0 is installed first, so pip never pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  $PY -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip setuptools wheel 2>&1 | grep -v "is ignored" || true
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "[setup] NVIDIA GPU found: installing torch with CUDA and the GPU extras are optional (pip install -e .[gpu])"
  $PIP install -q "torch>=2.4" 2>&1 | grep -v "is ignored" || true
else
  echo "[setup] no GPU: installing the CPU build of torch 2.13.0"
  $PIP install -q "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c "import torch,sys; v=torch.__version__; print('[setup] torch', v); sys.exit(0 if not torch.version.cuda else 1)" \
    || { echo "[setup] error: a CUDA build of torch was installed on a CPU machine" >&2; exit 1; }
fi
echo "[setup] installing megatron_zeppelin with its test extra"
$PIP install -q -e ".[test]" 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import megatron_zeppelin, megatron.core, torch; print('[setup] ok: megatron-core', megatron.core.__version__ if hasattr(megatron.core,'__version__') else '', 'torch', torch.__version__)"
bash scripts/setup_mlm.sh
