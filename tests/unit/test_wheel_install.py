"""A plain (not editable) install works: build the wheel, install it into a fresh venv outside the
repository, and from a directory outside it plan a batch, render SLURM jobs from a matrix preset and
check that the Megatron line advise prints runs an entry point that install has.

No network: the wheel is built without build isolation and installed with ``--no-deps``; the new venv
reaches this project's venv packages (torch, megatron-core, ...) through a .pth file. A .pth line
only adds a folder to ``sys.path`` (the .pth files inside it are not run), so the project venv's
editable install of this package stays inactive there: the venv imports the wheel's copy, which the
test checks. Everything lives under tmp_path; the repository is copied, never built in place.
"""

import os
import re
import shutil
import site
import subprocess
import sys
import zipfile

import numpy as np
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 600


def _run(cmd, cwd, env=None, timeout=TIMEOUT_S) -> str:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}: rc {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def _clean_env(venv: str) -> dict:
    """The environment of a user of that venv: this test's PYTHONPATH (the checkout) removed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PATH=os.path.join(venv, "bin") + os.pathsep + env.get("PATH", ""), VIRTUAL_ENV=venv,
               PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def _build_wheel(tmp_path) -> str:
    """The wheel of a copy of the package (setuptools writes build/ and egg-info beside setup.py)."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(os.path.join(REPO, "setup.py"), src)
    shutil.copytree(os.path.join(REPO, "megatron_zeppelin"), src / "megatron_zeppelin",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", str(dist), str(src)], cwd=str(tmp_path))
    wheels = list(dist.glob("megatron_zeppelin-*.whl"))
    assert len(wheels) == 1, wheels
    # every module and data file of the package is in it (a folder without __init__.py, or data
    # not declared in package_data, is left out silently)
    files = {p.relative_to(src).as_posix() for p in (src / "megatron_zeppelin").rglob("*") if p.is_file()}
    missing = sorted(files - set(zipfile.ZipFile(wheels[0]).namelist()))
    assert not missing, f"not in the wheel: {missing}"
    return str(wheels[0])


def _venv(tmp_path, wheel: str) -> str:
    venv = str(tmp_path / "v")
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=str(tmp_path))
    py = os.path.join(venv, "bin", "python")
    purelib = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=str(tmp_path)).strip()
    with open(os.path.join(purelib, "project_venv.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    # --ignore-installed: the project venv's editable megatron_zeppelin is visible to pip through the
    # .pth; install the wheel beside it instead of trying to replace it
    _run([py, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", wheel],
         cwd=str(tmp_path), env=_clean_env(venv))
    return venv


def _documents(prefix: str) -> str:
    """A tiny Megatron indexed dataset, so the rendered jobs name data that exists."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint8)
    for n in (8, 40, 200):
        doc = torch.full((n,), 7, dtype=torch.uint8)
        doc[-1] = 255
        b.add_document(doc, [n])
    b.finalize(prefix + ".idx")
    return prefix


def _entry_module(line: str) -> str:
    m = re.search(r"(?:torchrun|zeppelin_srun|zeppelin_launch)\s.*?-m\s+(\S+)", line)
    assert m, f"no `-m MODULE` entry in: {line[:300]}"
    return m.group(1)


def test_wheel_install_plans_renders_jobs_and_advises_runnable_entries(tmp_path):
    venv = _venv(tmp_path, _build_wheel(tmp_path))
    py, zeppelin = os.path.join(venv, "bin", "python"), os.path.join(venv, "bin", "zeppelin")
    env = _clean_env(venv)
    work = tmp_path / "work"  # outside the repository: nothing found relative to a checkout
    work.mkdir()
    cwd = str(work)
    site_dir = _run([py, "-c", "import megatron_zeppelin, os; print(os.path.dirname(megatron_zeppelin.__file__))"],
                    cwd, env).strip()
    assert site_dir.startswith(venv + os.sep), f"the venv imports {site_dir}, not the installed wheel"

    out = _run([zeppelin, "plan", "--cluster", "a800", "--dataset", "arxiv", "--nodes", "2",
                "--global-batch-tokens", "256K", "--seq-length", "16K"], cwd, env)
    assert "predicted iteration" in out and "cluster a800" in out, out

    # SLURM jobs from the installed CPU matrix preset, with data and an interpreter that exist here
    preset = os.path.join(site_dir, "presets", "runs", "slurm_cpu.yaml")
    with open(preset) as f:
        matrix = yaml.safe_load(f)
    matrix["defaults"].update(python=py, log_dir=str(work / "logs"))
    for run in matrix["runs"]:
        run["data_path"] = _documents(str(work / "docs"))
    (work / "m.yaml").write_text(yaml.safe_dump(matrix))
    out = _run([zeppelin, "slurm", "--matrix", "m.yaml", "--out", "jobs", "--dry-run"], cwd, env)
    scripts = sorted((work / "jobs").glob("*.sbatch"))
    assert {p.name for p in scripts} == {"tiny-cpu-zeppelin.sbatch", "tiny-cpu-dp.sbatch"}, out
    entries = set()
    for p in scripts:
        text = p.read_text()
        sourced = re.search(r"^source (\S+)$", text, re.M).group(1)
        assert sourced.startswith(site_dir + os.sep) and os.path.exists(sourced), sourced
        entries.add(_entry_module(text))
    assert "scripts/" not in "".join(p.read_text() for p in scripts)

    # advise's Megatron line (Zeppelin or stock, whichever it picks)
    out = _run([zeppelin, "advise", "--model", "llama-7b", "--cluster", "a800", "--nodes", "1", "--dataset",
                "fineweb", "--global-batch-tokens", "256K", "--seq-length", "8K", "--no-sim"], cwd, env)
    entries.add(_entry_module(next(ln for ln in out.splitlines() if "torchrun" in ln)))

    # every entry is a module of the installed wheel, and imports there (megatron comes in only at main())
    for module in sorted(entries):
        origin = _run([py, "-c", f"import {module} as m; assert callable(m.main); print(m.__file__)"], cwd, env).strip()
        assert origin.startswith(site_dir + os.sep), (module, origin)
