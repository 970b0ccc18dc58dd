#!/usr/bin/env bash
# Second virtualenv, .venv-mlm, for the Megatron-LM integration tests (tests/megatron_lm): Megatron's
# own training loop (megatron.training.pretrain) comes with megatron-core 0.19.2, which declares
# Python >= 3.12 and ships only a cp312 wheel. On Python 3.11 its sdist builds and runs (the one
# 3.12-only name the training code needs, typing.override, is set from typing_extensions by
# integration/cpu_megatron_lm.py), so it is installed with --no-deps --ignore-requires-python after
# its dependencies. The project's own .venv keeps megatron-core 0.16.1. Idempotent: a complete
# .venv-mlm is checked in seconds and left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
MCORE=0.19.2
V=.venv-mlm
check() {
  $V/bin/python - <<PY 2>/dev/null
import typing, typing_extensions
typing.override = getattr(typing, "override", typing_extensions.override)
import megatron.core, megatron_zeppelin, tensorboard
from megatron.training import pretrain
from megatron.core.datasets import helpers_cpp
assert megatron.core.__version__.split("+")[0] == "$MCORE", megatron.core.__version__
PY
}
if [ -x $V/bin/python ] && check; then
  echo "[setup] $V ok (megatron-core $MCORE with megatron.training)"
  exit 0
fi
echo "[setup] creating $V (megatron-core $MCORE with megatron.training) for tests/megatron_lm"
[ -x $V/bin/python ] || $PY -m venv $V
PIP="$V/bin/python -m pip"
$PIP install -q --upgrade pip setuptools wheel 2>&1 | grep -v "is ignored" || true
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  $PIP install -q "torch>=2.4" 2>&1 | grep -v "is ignored" || true
else
  $PIP install -q "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
fi
# megatron-core's runtime needs (numpy, packaging, einops, pyyaml), triton (a MoE op imports it),
# psutil (checkpointing), pybind11 (its dataset helpers' build), tensorboard (the tests read the
# per-iteration loss and grad norm from it), then megatron_zeppelin itself.
$PIP install -q numpy packaging einops pyyaml triton psutil typing_extensions pybind11 tensorboard \
  "rich>=13" "matplotlib>=3.7" 2>&1 | grep -v "is ignored" || true
$PIP install -q --no-deps --ignore-requires-python --no-build-isolation "megatron-core==$MCORE" 2>&1 \
  | grep -v "is ignored" || true
$PIP install -q --no-deps -e . 2>&1 | grep -v "is ignored" || true
check || { echo "[setup] error: $V cannot import megatron.training (megatron-core $MCORE)" >&2; exit 1; }
echo "[setup] $V ok (megatron-core $MCORE with megatron.training)"
