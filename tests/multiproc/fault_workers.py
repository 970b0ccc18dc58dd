"""Rank bodies that inject one fault each, and a launcher process to kill (used by test_launch.py and
test_faults.py; module level so that spawned ranks can import them).

``python fault_workers.py PIDDIR WORLD`` runs a launcher whose ranks write ``PIDDIR/rank_N.pid`` and
then meet in barriers until stopped; it exits 128 + the signal when SIGTERM/SIGINT stop it.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def die(rank, world, victim, how, stamp=""):
    """Every rank meets once; then ``victim`` fails (``how``) while the others wait in all_reduce.
    ``stamp``: a file where the victim writes the time of its fault."""
    dist.barrier()
    if rank == victim:
        if stamp:
            with open(stamp, "w") as f:
                f.write(repr(time.time()))
        if how == "kill9":
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "exit3":
            os._exit(3)
        elif how == "hang":
            time.sleep(3600)  # no collective: the peers' all_reduce times out
        raise RuntimeError(f"injected exception on rank {rank}")
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def meet_forever(rank, world, piddir):
    with open(os.path.join(piddir, f"rank_{rank}.pid.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(piddir, f"rank_{rank}.pid.tmp"), os.path.join(piddir, f"rank_{rank}.pid"))
    while True:
        dist.barrier()
        time.sleep(0.2)


def alive(pid: int) -> bool:
    """Running and not a zombie (an orphan's zombie may wait for a reaper that never comes)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True


def main(piddir: str, world: int) -> int:
    from fault_workers import meet_forever as body  # importable by name in the spawned ranks
    from megatron_zeppelin.distributed.launch import LaunchInterrupted, run_distributed
    try:
        run_distributed(body, world, piddir, timeout=120)
    except LaunchInterrupted as e:
        print(f"launcher: {e}", flush=True)
        return 128 + e.signum
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main(sys.argv[1], int(sys.argv[2])))


def kill_launcher(piddir: str, world: int, sig: int, start_timeout: float = 600.0) -> dict:
    """Start a launcher, wait for its ranks, send it ``sig``; return its exit status and the seconds
    until every rank was gone (None if some rank outlived 60 s)."""
    import subprocess
    launcher = subprocess.Popen([sys.executable, os.path.abspath(__file__), piddir, str(world)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids = []
    try:
        end = time.monotonic() + start_timeout
        while len(pids) < world:
            if launcher.poll() is not None or time.monotonic() > end:
                raise AssertionError(f"launcher did not start its ranks: {launcher.communicate()[0][-3000:]}")
            pids = [int(open(os.path.join(piddir, n)).read()) for n in sorted(os.listdir(piddir)) if n.endswith(".pid")]
            time.sleep(0.2)
        t0 = time.monotonic()
        launcher.send_signal(sig)
        gone = None
        while time.monotonic() - t0 < 60:
            if not any(alive(p) for p in pids):
                gone = time.monotonic() - t0
                break
            time.sleep(0.05)
        rc = launcher.wait(timeout=60)
        return {"rc": rc, "seconds": gone, "pids": pids, "output": launcher.communicate()[0]}
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for p in pids:  # never leave a rank behind, whatever the test found
            if alive(p):
                os.kill(p, signal.SIGKILL)
