"""What a rendered job needs on disk, checked before ``sbatch`` where the job will look for it.

A batch job starts in the directory ``sbatch`` was called from (``zeppelin slurm``'s own working
directory), or in the matrix's ``sbatch: {chdir: DIR}``: every relative path of the job resolves
there (the interpreter, the data prefixes Megatron opens, a Megatron-LM checkout). ``sbatch``
passes the caller's environment to the job (its default ``--export=ALL``), so ``$VAR`` in a path
and a bare interpreter name (looked up on ``PATH``) resolve as they do here. A job that could not
start (bash's exit 127, Megatron's missing ``.bin``) is named, with the matrix key to change,
before anything is submitted.

>>> data_prefixes("0.3 /d/a 0.7 /d/b"), data_prefixes(["/d/a"])
(['/d/a', '/d/b'], ['/d/a'])
>>> interpreter(".venv-mlm/bin/python", "/work/repo"), interpreter("python3", "/work/repo")
('/work/repo/.venv-mlm/bin/python', 'python3')
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from typing import Dict, List, Optional, Sequence

from megatron_zeppelin.slurm.args import SlurmError, data_words

_UNSET = re.compile(r"\$\{?(\w+)")


def _number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def data_prefixes(data_path) -> List[str]:
    """The dataset prefixes of ``data_path``: one prefix, or the prefixes of a blend (weight, prefix
    pairs, as Megatron's ``--data-path`` reads them)."""
    words = data_words(data_path)
    if any(_number(w) for w in words):
        pairs_ok = len(words) % 2 == 0 and all(_number(w) for w in words[::2]) and not any(
            _number(w) for w in words[1::2])
        if not pairs_ok:
            raise SlurmError(f"data_path {' '.join(words)!r} mixes weights and prefixes: a blend is "
                             "WEIGHT PREFIX pairs, e.g. '0.3 /data/a_text_document 0.7 /data/b_text_document'")
        return words[1::2]
    return words


def job_dir(run: Dict, submit_dir: str) -> str:
    """The job's working directory: the submit directory, or the matrix's ``sbatch: {chdir: DIR}``
    (relative to the submit directory, as sbatch reads it)."""
    chdir = (run.get("sbatch") or {}).get("chdir")
    if not chdir:
        return os.path.abspath(submit_dir)
    return os.path.normpath(os.path.join(submit_dir, os.path.expanduser(os.path.expandvars(str(chdir)))))


def _expand(path: str) -> str:
    return os.path.expanduser(os.path.expandvars(str(path)))


def interpreter(python: str, workdir: str) -> str:
    """The interpreter as the job script names it: a relative path (``.venv-mlm/bin/python``) made
    absolute against the job's directory, where bash in the job would look for it; a bare name
    (looked up on the job's ``PATH``), an absolute path or one with ``$VAR`` / ``~`` stays as written."""
    python = str(python)
    if "/" in python and not python.startswith(("/", "~", "$")) and "$" not in python:
        return os.path.normpath(os.path.join(workdir, python))
    return python


def _unset(path: str) -> Optional[str]:
    """The first ``$VAR`` that stays after expansion (unset here, so unset in the job)."""
    m = _UNSET.search(_expand(path))
    return m.group(1) if m else None


def python_problem(python: str, workdir: str) -> Optional[str]:
    """Why the job's ranks could not start ``python`` (None when they can)."""
    var = _unset(python)
    if var:
        return f"`python` {python}: ${var} is not set in this shell, and sbatch passes this environment to the job"
    if "/" not in python:
        if shutil.which(python) is None:
            return (f"`python` {python} is not on PATH here (sbatch passes this PATH to the job): "
                    "give the interpreter's path")
        return None
    path = os.path.join(workdir, _expand(python))
    if not os.path.isfile(path):
        where = "" if os.path.isabs(_expand(python)) else f" (a relative path resolves against the job's directory {workdir})"
        return f"`python` {python}: {path} does not exist{where}"
    if not os.access(path, os.X_OK):
        return f"`python` {python}: {path} is not executable"
    return None


def data_problems(data_path, workdir: str) -> List[str]:
    """Every prefix of ``data_path`` that lacks its ``.bin`` or ``.idx``."""
    out = []
    for prefix in data_prefixes(data_path):
        var = _unset(prefix)
        if var:
            out.append(f"`data_path` {prefix}: ${var} is not set in this shell, and sbatch passes this "
                       "environment to the job")
            continue
        path = os.path.join(workdir, _expand(prefix))
        missing = [path + ext for ext in (".bin", ".idx") if not os.path.isfile(path + ext)]
        if missing:
            where = "" if os.path.isabs(_expand(prefix)) else f" (relative to the job's directory {workdir})"
            out.append(f"`data_path` {prefix}: {' and '.join(missing)} do{'es' if len(missing) == 1 else ''} not "
                       f"exist{where}; a Megatron indexed dataset is PREFIX.bin + PREFIX.idx")
    return out


def entry_problem(entry: str, workdir: str, key: str) -> Optional[str]:
    """Why the job's training script cannot be found (None when it can); ``key`` is the matrix key
    that chose it ('' for the plugin's own scripts)."""
    var = _unset(entry)
    if var:
        return (f"`{key or 'entry'}`: {entry}: ${var} is not set in this shell, and sbatch passes this "
                "environment to the job" + (f": set it, or set {key} to the checkout's path" if key else ""))
    if entry.startswith("-m "):
        # The plugin's own entry module: it ships in the package, so it is found wherever this
        # install is (the job's python must be the same install: python_problem checks it runs).
        module = entry[3:].strip()
        if importlib.util.find_spec(module) is not None:
            return None
        return f"the plugin's entry module {module} is not importable: reinstall megatron_zeppelin"
    path = os.path.join(workdir, _expand(entry))
    if os.path.isfile(path):
        return None
    if key:
        return (f"`{key}`: {path} does not exist: set {key} to a Megatron-LM checkout holding pretrain_gpt.py, "
                f"or to '' for the plugin's stock entry (python -m megatron_zeppelin.integration.pretrain_gpt_packed)")
    return f"the plugin's entry {path} does not exist: reinstall megatron_zeppelin"


def check_jobs(jobs: Sequence) -> List[str]:
    """One line per problem that would stop jobs of ``jobs`` (render_jobs' Jobs) from starting, each
    naming the run, the modes when it is theirs alone (a missing checkout: the stock modes), and the
    matrix key to change; [] when every job can start."""
    run_lines: List[str] = []
    mode_lines: Dict[tuple, List[str]] = {}  # (run, problem) -> the modes it stops
    for j in jobs:
        p = python_problem(j.python, j.workdir)
        lines = ([p] if p else []) + data_problems(list(j.data_path), j.workdir)
        if not os.path.isfile(j.env_sh):
            lines.append(f"the job environment {j.env_sh} (sourced by every job) does not exist: reinstall "
                         "megatron_zeppelin")
        run_lines += [x for x in (f"run {j.name}: {line}" for line in lines) if x not in run_lines]
        e = entry_problem(j.entry, j.workdir, j.entry_key)
        if e:
            mode_lines.setdefault((j.name, e), []).append(j.mode)
    return run_lines + [f"run {name} ({', '.join(modes)}): {e}" for (name, e), modes in mode_lines.items()]
