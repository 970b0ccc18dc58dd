"""Before sbatch, every job's interpreter, data and entry script are found where the job will look
for them, or nothing is submitted; --collect names every failed job with its first error line."""

import os
import stat

import pytest
import yaml

from megatron_zeppelin.cli import main
from megatron_zeppelin.slurm.checks import data_prefixes
from megatron_zeppelin.slurm.jobs import render_jobs
from megatron_zeppelin.slurm.results import collect

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU = os.path.join(REPO, "megatron_zeppelin", "presets", "runs", "slurm_cpu.yaml")


def _exe(path, body="#!/bin/sh\nexit 0\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _dataset(prefix):
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for ext in (".bin", ".idx"):
        prefix.with_name(prefix.name + ext).write_bytes(b"")
    return prefix


def _matrix(tmp_path, **run):
    """A one-run CPU matrix (megatron_lm '' : the plugin's own entries) with ``run``'s keys."""
    r = {"name": "tiny", "model": "tiny", "nodes": 2, "gpus_per_node": 2, "device": "cpu", "emulate_nodes": True,
         "launcher": "srun", "megatron_lm": "", "seq_length": 256, "global_batch_tokens": "2K",
         "modes": ["zeppelin", "dp"], **run}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"runs": [r]}))
    return str(path)


@pytest.fixture
def submit_dir(tmp_path, monkeypatch):
    d = tmp_path / "submit"
    d.mkdir()
    monkeypatch.chdir(d)
    return d


def _sbatch_spy(tmp_path, monkeypatch):
    """A fake sbatch on PATH that records what it was asked to submit."""
    calls = tmp_path / "sbatch-calls"
    _exe(tmp_path / "bin" / "sbatch", f'#!/bin/sh\necho "$1" >> {calls}\necho "Submitted batch job 7"\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_missing_data_python_and_checkout_are_named_and_nothing_is_submitted(tmp_path, submit_dir, monkeypatch,
                                                                               capsys):
    calls = _sbatch_spy(tmp_path, monkeypatch)
    m = _matrix(tmp_path, data_path="data/docs", python="venv/bin/python", megatron_lm=str(tmp_path / "no-mlm"))
    assert main(["slurm", "--matrix", m, "--out", str(tmp_path / "jobs")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert any("run tiny:" in e and "`data_path` data/docs" in e and str(submit_dir / "data" / "docs.bin") in e
               for e in err), err
    assert any("run tiny:" in e and "`python` venv/bin/python" in e and "job's directory" in e for e in err), err
    assert any("run tiny (dp):" in e and "`megatron_lm`" in e and "pretrain_gpt.py" in e for e in err), err  # its only stock mode
    assert "nothing rendered or submitted" in err[-1]
    assert not calls.exists() and not (tmp_path / "jobs").exists()
    # the same checks in a dry run
    assert main(["slurm", "--matrix", m, "--out", str(tmp_path / "jobs"), "--dry-run"]) == 2
    assert "sbatch " not in capsys.readouterr().out


def test_jobs_that_can_start_are_all_submitted(tmp_path, submit_dir, monkeypatch, capsys):
    calls = _sbatch_spy(tmp_path, monkeypatch)
    _dataset(submit_dir / "data" / "docs")
    _exe(submit_dir / "venv" / "bin" / "python")
    m = _matrix(tmp_path, data_path="data/docs", python="venv/bin/python")
    assert main(["slurm", "--matrix", m, "--out", str(tmp_path / "jobs")]) == 0
    assert len(calls.read_text().split()) == 2, capsys.readouterr()


def test_relative_python_resolves_against_the_submit_directory(tmp_path, submit_dir):
    """bash in the job would look for a relative interpreter in the job's directory (exit 127 when it
    is not there): the script names it by its absolute path, and the check looks there."""
    py = _exe(submit_dir / ".venv-mlm" / "bin" / "python")
    jobs = render_jobs(_matrix(tmp_path, data_path="/d", python=".venv-mlm/bin/python"), str(tmp_path / "jobs"))
    assert all(f"export ZEPPELIN_PYTHON={py}\n" in j.script for j in jobs)
    # sbatch's --chdir moves the job, and with it where relative paths resolve
    other = tmp_path / "elsewhere"
    jobs = render_jobs(_matrix(tmp_path, data_path="/d", python=".venv-mlm/bin/python",
                               sbatch={"chdir": str(other)}), str(tmp_path / "jobs"))
    assert all(f"export ZEPPELIN_PYTHON={other / '.venv-mlm' / 'bin' / 'python'}\n" in j.script for j in jobs)


def test_bare_interpreter_is_looked_up_on_path(tmp_path, submit_dir, capsys):
    _dataset(submit_dir / "d")
    m = _matrix(tmp_path, data_path="d", python="no-such-python-zz")
    assert main(["slurm", "--matrix", m, "--out", str(tmp_path / "jobs"), "--dry-run"]) == 2
    assert "`python` no-such-python-zz is not on PATH" in capsys.readouterr().err


def test_every_prefix_of_a_blend_is_checked(tmp_path, submit_dir, capsys):
    _dataset(submit_dir / "a")
    _exe(submit_dir / "py")
    m = _matrix(tmp_path, data_path="0.3 a 0.7 b", python="./py")
    assert main(["slurm", "--matrix", m, "--out", str(tmp_path / "jobs"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "`data_path` b:" in err and "`data_path` a:" not in err
    _dataset(submit_dir / "b")
    assert main(["slurm", "--matrix", m, "--out", str(tmp_path / "jobs"), "--dry-run"]) == 0
    args = list(render_jobs(m, str(tmp_path / "jobs"))[0].args)
    assert args[args.index("--data-path") + 1:][:4] == ["0.3", "a", "0.7", "b"]  # Megatron's blend words
    assert data_prefixes([0.3, "a", 0.7, "b"]) == ["a", "b"]
    with pytest.raises(ValueError, match="WEIGHT PREFIX pairs"):
        data_prefixes("0.3 a b")


def test_unset_variable_in_a_path_is_named(tmp_path, submit_dir, monkeypatch, capsys):
    monkeypatch.delenv("ZZ_UNSET_DATA", raising=False)
    _exe(submit_dir / "py")
    m = _matrix(tmp_path, data_path="$ZZ_UNSET_DATA/docs", python="./py")
    assert main(["slurm", "--matrix", m, "--out", str(tmp_path / "jobs"), "--dry-run"]) == 2
    assert "$ZZ_UNSET_DATA is not set" in capsys.readouterr().err


def test_cpu_recipe_data_is_made_where_the_matrix_expects_it(tmp_path, submit_dir, capsys):
    """docs/slurm.md's recipe: --tiny-data writes the CPU matrix's data_path; then its dry run passes."""
    with open(CPU) as f:
        matrix = yaml.safe_load(f)
    prefix = matrix["runs"][0]["data_path"]
    _exe(submit_dir / matrix["defaults"]["python"])  # the recipe's .venv-mlm, relative to the submit dir
    assert main(["slurm", "--matrix", CPU, "--out", "out/slurm-cpu", "--dry-run"]) == 2
    assert f"`data_path` {prefix}" in capsys.readouterr().err
    assert main(["slurm", "--tiny-data", prefix]) == 0
    assert (submit_dir / (prefix + ".bin")).stat().st_size > 0 and (submit_dir / (prefix + ".idx")).exists()
    assert main(["slurm", "--matrix", CPU, "--out", "out/slurm-cpu", "--dry-run"]) == 0
    assert main(["slurm", "--tiny-data", prefix]) == 0 and "kept" in capsys.readouterr().out


def _log(path, head=True, iters=(), total=6, tail=""):
    text = ("[zeppelin-slurm] run=r mode={m} nodes=2 gpus_per_node=2 world=4 tokens_per_iteration=2048\n"
            .format(m=path.name.split("-")[1]) if head else "")
    text += "".join(f" iteration {i:>8}/{total:>8} | elapsed time per iteration (ms): 100.0 | lm loss: 5.0 |\n"
                    for i in iters)
    path.write_text(text + tail)


def test_collect_names_every_failed_job(tmp_path, capsys):
    _log(tmp_path / "r-dp-1.log", iters=range(1, 7))
    _log(tmp_path / "r-zeppelin-2.log", iters=range(1, 3), tail=(
        "some warning\nTraceback (most recent call last):\n  File \"pretrain.py\", line 3, in <module>\n"
        "    main()\nRuntimeError: planner ran out of memory\nsrun: error: n1: task 0: Exited with exit code 1\n"))
    _log(tmp_path / "r-cp_p2p-3.log", tail=("bash: line 1: /x/.venv-mlm/bin/python: No such file or directory\n"
                                            "srun: error: n1: task 0: Exited with exit code 127\n"))
    _log(tmp_path / "r-cp_all_gather-4.log", head=False,
         tail="/var/spool/job4/slurm_script: line 6: /x/env.sh: No such file or directory\n")
    _log(tmp_path / "r-cp_a2a_p2p-5.log", iters=range(1, 4))
    (tmp_path / "notes.log").write_text("not a job log\n")
    assert main(["slurm", "--collect", str(tmp_path), "--warmup", "1", "--json", str(tmp_path / "r.json")]) == 1
    out, err = capsys.readouterr()
    failed = [e for e in err.splitlines() if e.startswith("zeppelin slurm: failed:")]
    assert len(failed) == 4, err
    assert any("r zeppelin" in e and "RuntimeError: planner ran out of memory" in e for e in failed)
    assert any("r cp_p2p" in e and "No such file or directory" in e and "127" not in e for e in failed)
    assert any("r cp_all_gather" in e and "before the job script's header" in e and "env.sh" in e for e in failed)
    assert any("r cp_a2a_p2p" in e and "after iteration 3 of 6 with no error line" in e for e in failed)
    assert "r dp" not in err and out.count("FAILED") == 4
    recs = {r["mode"]: r for r in collect(str(tmp_path), warmup=1)}
    assert recs["dp"]["status"] == "ok" and recs["dp"]["tokens_per_s"] == pytest.approx(20480.0)
    assert recs["zeppelin"]["tokens_per_s"] is None and "notes" not in str(recs)


def test_collect_of_finished_jobs_exits_0_and_warmup_covering_a_job_is_named(tmp_path, capsys):
    _log(tmp_path / "r-dp-1.log", iters=range(1, 7))
    assert main(["slurm", "--collect", str(tmp_path), "--warmup", "1"]) == 0
    assert main(["slurm", "--collect", str(tmp_path), "--warmup", "6"]) == 1
    assert "lower --warmup" in capsys.readouterr().err


def test_a_failed_job_rerun_after_a_fix_no_longer_fails_collect(tmp_path, capsys):
    _log(tmp_path / "r-dp-3.log", tail="bash: line 1: /x/python: No such file or directory\n")
    assert main(["slurm", "--collect", str(tmp_path), "--warmup", "1"]) == 1
    assert "FAILED" in capsys.readouterr().out
    _log(tmp_path / "r-dp-12.log", iters=range(1, 7))  # the later job of the same run and mode
    assert main(["slurm", "--collect", str(tmp_path), "--warmup", "1"]) == 0
    assert "FAILED" not in capsys.readouterr().out
