"""Collect measured throughput from the logs of rendered SLURM jobs (Megatron's log format).

Each job log starts with the job script's header ``[zeppelin-slurm] run=NAME mode=MODE ...
tokens_per_iteration=N`` and then Megatron's per-iteration lines. The first ``warmup`` iterations are
dropped; the median of the rest is the iteration time, and tokens per second is the run's tokens per
iteration (the same in every mode of a run) over it: the number the modes are compared by.

>>> log = '''[zeppelin-slurm] run=7b mode=cp_p2p nodes=2 gpus_per_node=8 world=16 tokens_per_iteration=1048576
...  [2026-01-01 00:00:01] iteration        1/       4 | elapsed time per iteration (ms): 9000.0 | lm loss: 9.1 |
...  [2026-01-01 00:00:02] iteration        2/       4 | elapsed time per iteration (ms): 1200.0 | lm loss: 8.9 |
...  [2026-01-01 00:00:03] iteration        3/       4 | elapsed time per iteration (ms): 1000.0 | lm loss: 8.7 |
...  [2026-01-01 00:00:04] iteration        4/       4 | elapsed time per iteration (ms): 1024.0 | lm loss: 8.6 |'''
>>> r = parse_log(log, warmup=1)
>>> r["strategy"], r["iteration_s"], r["tokens_per_s"], r["iterations"], r["final_loss"], r["status"]
('static_cp', 1.024, 1024000.0, 3, 8.6, 'ok')

A job that did not reach its last iteration failed; its first error line says why (the exception
of the first Python traceback, else the first line that reads as an error: bash's exit 127, srun's
``error:``, a kill by SLURM):

>>> first_error(["[zeppelin-slurm] run=r", "bash: line 1: .venv/bin/python: No such file or directory",
...              "srun: error: n1: task 0: Exited with exit code 127"])
'bash: line 1: .venv/bin/python: No such file or directory'
>>> first_error(["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
...              "    f()", "ValueError: bad flag", "srun: error: n1: task 3: Exited with exit code 1"])
'ValueError: bad flag'
>>> first_error(["usage: pretrain_gpt.py [-h] [--num-layers NUM_LAYERS]", "       [--error-injection-rate R]",
...              "pretrain_gpt.py: error: unrecognized arguments: --bogus"])
'pretrain_gpt.py: error: unrecognized arguments: --bogus'
>>> first_error(["[rank1]: Traceback (most recent call last):", '[rank1]:   File "x.py", line 1, in <module>',
...              "[rank1]: RuntimeError: boom"])
'RuntimeError: boom'
"""

from __future__ import annotations

import csv
import glob
import json
import os
import re
import statistics
from typing import Dict, List, Optional

STRATEGY_OF_MODE = {"zeppelin": "zeppelin", "dp": "packed_dp", "cp_p2p": "static_cp",
                    "cp_a2a_p2p": "static_cp_hier", "cp_all_gather": "allgather_cp"}
_HEAD = re.compile(r"\[zeppelin-slurm\] run=(\S+) mode=(\S+) nodes=(\d+) gpus_per_node=(\d+)"
                   r"(?: world=(\d+))?(?: tokens_per_iteration=(\d+))?")
_ITER = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|.*?elapsed time per iteration \(ms\): ([\d.]+)")
_LOSS = re.compile(r"lm loss: ([\d.eE+-]+)")
# A job log's name, as rendered: {run}-{mode}-{job id}.log (run names may hold dashes).
_LOG_NAME = re.compile(r"^(.+)-(" + "|".join(STRATEGY_OF_MODE) + r")-(\d+)\.log$")
_ERROR = re.compile(r"\b(?:error|ERROR|Error)\b|No such file or directory|command not found|Permission denied|"
                    r"\bKilled\b|CANCELLED|DUE TO TIME LIMIT|Segmentation fault|core dumped|Aborted|exit code [1-9]")
_RANK = re.compile(r"^\[(?:rank|default)\d*\]:\s?")  # torch's prefix on a rank's error output
FAILED = ("failed", "incomplete", "no_header")  # statuses of a job without a result


def first_error(lines: List[str]) -> Optional[str]:
    """The first line that says why a job failed: the exception line closing the first Python
    traceback (a rank's root cause; tracebacks of the launcher follow it), else the first line that
    reads as an error; None when no line does."""
    lines = [_RANK.sub("", ln) for ln in lines]
    in_tb = False
    for line in lines:
        if line.startswith("Traceback (most recent call last)"):
            in_tb = True
        elif in_tb and line.strip() and not line[0].isspace() and not line.startswith("During handling"):
            return line.strip()[:300]
    # Not an indented line (a traceback's frames, an argparse usage's continuation listing
    # `--error-injection-rate`) nor a usage line: the message itself.
    return next((ln.strip()[:300] for ln in lines
                 if ln[:1].strip() and not ln.startswith("usage:") and _ERROR.search(ln)), None)


def parse_log(text: str, warmup: int = 3) -> Optional[Dict]:
    head = _HEAD.search(text)
    if not head:
        return None
    times, loss, last, total = [], None, 0, None
    lines = text.splitlines()
    for line in lines:
        m = _ITER.search(line)
        if m:
            last, total = int(m.group(1)), int(m.group(2))
            if last > warmup:
                times.append(float(m.group(3)) / 1e3)
            lm = _LOSS.search(line)
            loss = float(lm.group(1)) if lm else loss
    run, mode, nodes, gpn, _, tokens = head.groups()
    it = statistics.median(times) if times else None
    tokens = int(tokens) if tokens else None
    done = total is not None and last >= total
    error = None if done else first_error(lines)
    status = "ok" if done else ("failed" if error else "incomplete")
    return {"run": run, "mode": mode, "strategy": STRATEGY_OF_MODE.get(mode, mode), "nodes": int(nodes),
            "gpus_per_node": int(gpn), "tokens_per_iteration": tokens,
            "tokens_per_s": round(tokens / it, 1) if (tokens and it and done) else None,
            "iteration_s": it if done else None, "iterations": len(times), "final_loss": loss,
            "source": "measured", "status": status, "last_iteration": last, "train_iters": total, "error": error}


def _headless(path: str, text: str) -> Optional[Dict]:
    """A job log (by its rendered name) that ended before the job script's header line: the job
    failed before starting its ranks (e.g. a missing env.sh). Other files are not job logs."""
    m = _LOG_NAME.match(os.path.basename(path))
    if not m:
        return None
    return {"run": m.group(1), "mode": m.group(2), "strategy": STRATEGY_OF_MODE[m.group(2)], "nodes": None,
            "gpus_per_node": None, "tokens_per_iteration": None, "tokens_per_s": None, "iteration_s": None,
            "iterations": 0, "final_loss": None, "source": "measured", "status": "no_header",
            "last_iteration": 0, "train_iters": None, "error": first_error(text.splitlines())}


def why_failed(r: Dict) -> str:
    """One line: the failed job, its log and why it has no result."""
    head = f"{r['run']} {r['mode']} ({r['log']})"
    if r["status"] == "failed":
        return f"{head}: failed at iteration {r['last_iteration']}: {r['error']}"
    if r["status"] == "no_header":
        return f"{head}: stopped before the job script's header line: {r['error'] or '(no error line in the log)'}"
    of = f" of {r['train_iters']}" if r["train_iters"] else ""
    return (f"{head}: stopped after iteration {r['last_iteration']}{of} with no error line: still running "
            "(see squeue), or killed without a word")


def collect(log_dir: str, warmup: int = 3) -> List[Dict]:
    """Every job log of ``log_dir``; a job without a result that a later job of the same run and mode
    (a larger SLURM job id) replaced is left out: the rerun after a fix is what counts."""
    out = []
    for path in sorted(glob.glob(os.path.join(log_dir, "*.log"))):
        with open(path, errors="replace") as f:
            text = f.read()
        rec = parse_log(text, warmup) or _headless(path, text)
        if rec:
            rec["log"] = path
            out.append(rec)
    return [r for r in out if not (r["status"] in FAILED and any(
        o["run"] == r["run"] and o["mode"] == r["mode"] and _job_id(o) > _job_id(r) for o in out))]


def _job_id(rec: Dict) -> int:
    m = re.search(r"-(\d+)\.log$", rec["log"])
    return int(m.group(1)) if m else 0


def table(records: List[Dict]) -> str:
    """One line per job, runs together, fastest (tokens/s) first; speed-up over the run's dp job."""
    lines = [f"{'run':<20} {'mode':<14} {'strategy':<15} {'tokens/s':>12} {'iteration':>11} {'vs dp':>7} {'iters':>5}"]
    for run in sorted({r["run"] for r in records}):
        rs = sorted((r for r in records if r["run"] == run), key=lambda r: -(r["tokens_per_s"] or 0))
        dp = next((r["tokens_per_s"] for r in rs if r["mode"] == "dp" and r["tokens_per_s"]), None)
        for r in rs:
            tps = "n/a" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.1f}"
            tps = "FAILED" if r.get("status") in FAILED else tps
            it = "n/a" if r["iteration_s"] is None else f"{r['iteration_s']:.3f}s"
            vs = f"{r['tokens_per_s'] / dp:.2f}x" if (dp and r["tokens_per_s"]) else "-"
            lines.append(f"{run:<20} {r['mode']:<14} {r['strategy']:<15} {tps:>12} {it:>11} {vs:>7} {r['iterations']:>5}")
    return "\n".join(lines)


def write_results(records: List[Dict], json_path: Optional[str], csv_path: Optional[str]) -> None:
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"runs": records}, f, indent=2)
    if csv_path and records:
        keys = list(records[0])
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(records)
