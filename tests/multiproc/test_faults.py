"""The fault table: each fault kind on a world-4 job -> the rank the launcher names, its exit status and
the seconds from the fault to the end of the job (every rank gone). Printed, and written as Markdown to
$ZEPPELIN_FAULT_TABLE when set:

    ZEPPELIN_FAULT_TABLE=faults.md .venv/bin/python -m pytest -m slow -s tests/multiproc/test_faults.py
"""

import os
import signal
import time

import pytest

from fault_workers import die, kill_launcher
from megatron_zeppelin.distributed.failure import exit_status
from megatron_zeppelin.distributed.launch import DistributedFailure, run_distributed

WORLD, VICTIM, HANG_TIMEOUT = 4, 2, 30  # a healthy collective on a loaded machine stays well under 30 s


def _rank_fault(tmp_path, how):
    stamp = str(tmp_path / f"{how}.t")
    with pytest.raises(DistributedFailure) as e:
        run_distributed(die, WORLD, VICTIM, how, stamp, timeout=HANG_TIMEOUT if how == "hang" else 120)
    end = time.time()
    d = e.value.diagnosis
    status = "raised (exit 0)" if d.kind == "exception" else "blocked (alive)" if d.kind == "hang" else exit_status(d.exitcode)
    return {"named": f"rank {d.rank}", "ok": d.rank == VICTIM, "status": status,
            "seconds": end - float(open(stamp).read()), "first line": str(e.value).splitlines()[0]}


def _launcher_fault(tmp_path, sig):
    piddir = tmp_path / f"pids_{sig}"
    piddir.mkdir()
    r = kill_launcher(str(piddir), WORLD, sig)
    return {"named": "launcher", "ok": r["seconds"] is not None, "status": f"launcher {exit_status(r['rc'])}"
            if r["rc"] < 0 else f"launcher exited {r['rc']}", "seconds": r["seconds"] if r["seconds"] is not None
            else float("nan"), "first line": next((ln for ln in r["output"].splitlines() if ln.startswith("launcher:")),
                                  "(killed: no output)")}


@pytest.mark.slow
def test_fault_table(tmp_path, capsys):
    rows = {"exception on rank 2": _rank_fault(tmp_path, "raise"),
            "kill -9 of rank 2": _rank_fault(tmp_path, "kill9"),
            "os._exit(3) on rank 2": _rank_fault(tmp_path, "exit3"),
            f"hang on rank 2 (timeout {HANG_TIMEOUT}s)": _rank_fault(tmp_path, "hang"),
            "launcher SIGTERM": _launcher_fault(tmp_path, signal.SIGTERM),
            "launcher SIGKILL": _launcher_fault(tmp_path, signal.SIGKILL)}
    lines = [f"world {WORLD}, gloo on CPU; load average at the end {os.getloadavg()[0]:.1f}", "",
             "| fault | rank named | exit status | seconds to end | first line of the error |",
             "|---|---|---|---|---|"]
    lines += [f"| {k} | {r['named']} | {r['status']} | {r['seconds']:.1f} | {r['first line'][:110]} |"
              for k, r in rows.items()]
    table = "\n".join(lines)
    with capsys.disabled():
        print("\n" + table)
    if os.environ.get("ZEPPELIN_FAULT_TABLE"):
        with open(os.environ["ZEPPELIN_FAULT_TABLE"], "w") as f:
            f.write(table + "\n")
    assert all(r["ok"] for r in rows.values()), table
