#!/usr/bin/env bash
# Load this machine like a busy shared CI host: 8 busy-loop processes plus another multi-process gloo
# job (4 ranks all-reducing 1 MB in a loop, restarted as it ends), for SECONDS (default 1200), then
# everything stops by itself. Every piece is bounded in time on its own; Ctrl-C / SIGTERM stop it early.
#
#   bash scripts/load.sh [SECONDS]                       # load only (e.g. in another terminal)
#   bash scripts/load.sh [SECONDS] -- COMMAND [ARGS...]  # load while COMMAND runs; exits with its status
#
# e.g. the suite under load:  bash scripts/load.sh 1800 -- .venv/bin/python -m pytest
set -u
cd "$(dirname "$0")/.."
DUR=${1:-1200}
[ $# -gt 0 ] && shift
PY=${PYTHON:-.venv/bin/python}
dir=$(mktemp -d "${TMPDIR:-/tmp}/zeppelin-load.XXXXXX")
until=$(( $(date +%s) + DUR ))
pids=()

cleanup() {
  touch "$dir/stop"  # the gloo job checks it between collectives
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cat > "$dir/gloo_job.py" <<'EOF'
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")  # torchrun --standalone: a free rendezvous port, no collision
until, stop = float(sys.argv[1]), sys.argv[2]
t = torch.ones(1 << 18)
while time.time() < until and not os.path.exists(stop):
    for _ in range(20):
        dist.all_reduce(t)
        t.div_(dist.get_world_size())
dist.destroy_process_group()
EOF

for _ in $(seq 8); do
  timeout "$DUR" bash -c 'while :; do :; done' &
  pids+=($!)
done
timeout "$DUR" bash -c "while [ \$(date +%s) -lt $until ] && [ ! -e '$dir/stop' ]; do
  '$PY' -m torch.distributed.run --standalone --nproc-per-node 4 '$dir/gloo_job.py' $until '$dir/stop' \
    >>'$dir/gloo.log' 2>&1 || sleep 1
done" &
pids+=($!)
echo "[load] 8 busy loops + a 4-rank gloo job for ${DUR}s (until $(date -u -d "@$until" +%H:%M:%S) UTC)" >&2

if [ "${1:-}" = "--" ]; then
  shift
  # The command runs in its own session so SIGTERM/SIGINT to this script stop it and all its children
  # (a foreground child would keep running until it ended, and bash defers traps until then).
  setsid "$@" &
  cmd=$!
  trap 'kill -TERM -- -$cmd 2>/dev/null; wait $cmd; exit 130' INT
  trap 'kill -TERM -- -$cmd 2>/dev/null; wait $cmd; exit 143' TERM
  wait $cmd
  rc=$?
  echo "[load] command exited $rc; load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  exit $rc
fi
wait
