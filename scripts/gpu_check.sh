#!/usr/bin/env bash
# The prepared GPU check (one GPU, < 8 minutes): every kernel backend present against the float64
# oracle (pytest -m gpu), `zeppelin calibrate --device cuda`, and the kernel benchmark (Zeppelin's
# local queue vs one packed varlen call vs one call per document). Everything lands in one folder.
#
#   bash scripts/gpu_check.sh [OUTDIR]        # OUTDIR defaults to $OUT, else results/gpu_check
#
# No network is needed: Python packages the machine lacks travel as wheels in .whl/ (ignored by git),
# e.g. megatron-core for Python 3.12, fetched where pip works with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl megatron-core==0.16.1
# and installed here into a private target before anything runs (megatron-core needs only numpy,
# packaging and torch, which the machine has; Transformer Engine and flash-attn are not carried: TE's
# CUDA wheels exceed the 64 MiB a call may carry and flash-attn ships no wheels on PyPI, so their
# tests skip, saying so). With the device tool, one call of at most 9 minutes:
#   run(command="bash scripts/gpu_check.sh $OUT", carry=[".whl"], timeout_s=540)
# Each stage has its own time limit (together 7.5 minutes) and a failing stage does not stop the
# others; the exit status is the number of failed stages.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-${OUT:-results/gpu_check}}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
W="$(mktemp -d)"  # stages write here; DIR gets the summary, the results and one archive of all logs
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fail=0
stage() {  # stage NAME SECONDS CMD...: run with a limit, log to $W/NAME.log, count failures
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s): $*" | tee -a "$W/summary.txt"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0))s" | tee -a "$W/summary.txt"
  tail -n 5 "$W/$name.log" | sed 's/^/   | /' | tee -a "$W/summary.txt"
  [ "$rc" -eq 0 ] || fail=$((fail + 1))
}

: > "$W/summary.txt"
if compgen -G ".whl/*.whl" > /dev/null; then
  stage wheels 40 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/zeppelin_site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/zeppelin_site"
fi
stage env 30 bash -c "nvidia-smi; $PY - <<'PY'
import importlib.util, torch
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'device', torch.cuda.get_device_name())
for m in ('megatron.core', 'transformer_engine', 'flash_attn'):
    print(m, 'installed' if importlib.util.find_spec(m.split('.')[0]) else 'absent')
from megatron_zeppelin.attention.kernels import Kernel
for impl in ('local', 'transformer_engine'):
    print('auto kernel with --transformer-impl', impl, '->', Kernel('auto', impl).resolve(torch.device('cuda'), torch.bfloat16))
PY"
stage collect 40 "$PY" -m pytest -m gpu tests/gpu --collect-only -q -p no:cacheprovider
stage pytest_gpu 220 "$PY" -m pytest -m gpu tests/gpu -q -rs -p no:cacheprovider --junitxml="$W/pytest_gpu.xml"
stage calibrate 60 "$PY" -c 'import sys; from megatron_zeppelin.cli import main; sys.exit(main(sys.argv[1:]))' \
  calibrate --device cuda --lengths 512 2048 8192 32768 --repeats 3 --out "$W/calibrate.yaml"
stage bench_kernels 60 "$PY" benchmarks/bench_kernels.py --device cuda --out "$W/bench_kernels.json"
echo "failed stages: $fail (all logs in $DIR/gpu_check_logs.tgz)" | tee -a "$W/summary.txt"
for f in summary.txt bench_kernels.json calibrate.yaml pytest_gpu.xml; do [ -f "$W/$f" ] && cp "$W/$f" "$DIR/"; done
tar czf "$DIR/gpu_check_logs.tgz" -C "$W" . && rm -rf "$W"
exit "$fail"
