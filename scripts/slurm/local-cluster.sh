#!/usr/bin/env bash
# A one-node SLURM on this machine, for running the rendered jobs for real (tests/slurm, docs/slurm.md).
#
#   bash scripts/slurm/local-cluster.sh start    # install (as root, if missing), configure, start, wait idle
#   bash scripts/slurm/local-cluster.sh status   # daemons and the node's state; exit 0 only when usable
#   bash scripts/slurm/local-cluster.sh stop     # cancel jobs, stop slurmctld, slurmd and munged
#   eval "$(bash scripts/slurm/local-cluster.sh env)"   # SLURM_CONF for sbatch/squeue/scancel
#
# Debian's slurmctld/slurmd/slurm-client (22.05) and munge. Everything (munge key and socket, slurm.conf,
# state, spool, logs, pid files) lives in one folder, $ZEPPELIN_SLURM_DIR (default out/slurm-cluster of
# the repository), so nothing under /etc is touched. No cgroups: proctrack/linuxproc and task/none, and no
# cgroup.conf (22.05 rejects CgroupPlugin=disabled). The node offers $ZEPPELIN_SLURM_CPUS CPU slots
# (default 4, SlurmdParameters=config_overrides) so a job of 2 emulated nodes x 2 ranks fits on a
# 2-core machine; jobs of 4 tasks then run one at a time.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${ZEPPELIN_SLURM_DIR:-$REPO/out/slurm-cluster}
CPUS=${ZEPPELIN_SLURM_CPUS:-4}
CTLD_PORT=${ZEPPELIN_SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${ZEPPELIN_SLURM_SLURMD_PORT:-6818}
HOST=$(hostname -s)
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF

log() { echo "[local-cluster] $*" >&2; }
die() { log "error: $*"; exit 1; }

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

install_packages() {
  local missing=()
  command -v munged >/dev/null || missing+=(munge)
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v sbatch >/dev/null || missing+=(slurm-client)
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root"
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
  log "installing ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

write_config() {
  mkdir -p "$DIR"/{munge,state,spool,log,run}
  local user; user=$(id -un)
  if [ ! -s "$DIR/munge/munge.key" ]; then
    head -c 1024 /dev/urandom > "$DIR/munge/munge.key"
  fi
  chmod 700 "$DIR/munge"; chmod 400 "$DIR/munge/munge.key"
  cat > "$CONF" <<EOF
# Written by scripts/slurm/local-cluster.sh: a one-node cluster on $HOST, state in $DIR.
ClusterName=zeppelin-local
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=local Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

node_state() { sinfo -h -N -o %T 2>/dev/null | head -n 1; }

start() {
  install_packages
  if pid_alive "$DIR/run/slurmctld.pid" && pid_alive "$DIR/run/slurmd.pid"; then
    log "already running (SLURM_CONF=$CONF)"; status; return
  fi
  stop_daemons quiet
  write_config
  munged --force --key-file "$DIR/munge/munge.key" --socket "$DIR/munge/munge.socket" \
    --pid-file "$DIR/run/munged.pid" --log-file "$DIR/log/munged.log" --seed-file "$DIR/munge/munge.seed" \
    || die "munged did not start (see $DIR/log/munged.log)"
  slurmctld -c -f "$CONF" || die "slurmctld did not start (see $DIR/log/slurmctld.log)"
  slurmd -f "$CONF" || die "slurmd did not start (see $DIR/log/slurmd.log)"
  local s=""
  for _ in $(seq 1 60); do
    s=$(node_state)
    case "$s" in idle|mixed|allocated) log "up: node $HOST $s, $CPUS CPU slots (SLURM_CONF=$CONF)"; return 0;; esac
    sleep 1
  done
  log "node state after 60 s: '${s:-none}'"
  tail -n 5 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
  stop_daemons quiet
  die "the node did not become idle"
}

# Stop one daemon by its pid file; SIGKILL after 20 s. Only the processes this script started.
stop_pid() {
  local f=$1 name=$2 pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then log "$name ($pid) still up after 20 s: SIGKILL"; kill -9 "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$f"
}

stop_daemons() {
  if [ -s "$CONF" ] && pid_alive "$DIR/run/slurmctld.pid"; then
    scancel --full --quiet --partition=local 2>/dev/null || true   # every job of this cluster
    for _ in $(seq 1 30); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 1; done
  fi
  stop_pid "$DIR/run/slurmd.pid" slurmd
  stop_pid "$DIR/run/slurmctld.pid" slurmctld
  stop_pid "$DIR/run/munged.pid" munged
  [ "${1:-}" = quiet ] || log "stopped"
}

status() {
  local ok=0 d
  for d in munged slurmctld slurmd; do
    if pid_alive "$DIR/run/$d.pid"; then echo "$d: running (pid $(cat "$DIR/run/$d.pid"))"
    else echo "$d: not running"; ok=1; fi
  done
  if [ $ok -eq 0 ]; then
    echo "node $HOST: $(node_state)"; squeue 2>/dev/null || true
    echo "SLURM_CONF=$CONF"
  fi
  return $ok
}

case "${1:-}" in
  start) start ;;
  stop) stop_daemons ;;
  status) status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
