"""The command's errors as the README promises them: one line naming the sub-command and the flag, exit
2, before any work; negative values read as values; a closed pipe ends the command quietly."""

import os
import subprocess
import sys

import pytest

from megatron_zeppelin.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _one_line_error(capsys, argv, rc=2):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == rc
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("flag", ["--global-batch-tokens", "--context-length"])
def test_negative_token_counts_are_values_refused_in_one_line(capsys, flag):
    line = _one_line_error(capsys, ["plan", flag, "-1M"])
    assert line.startswith("zeppelin plan: error: argument") and "'-1M' is not a whole, non-negative token count" in line
    assert "expected one argument" not in line and "--help" in line


def test_a_negative_int_reaches_the_flags_own_check(capsys):  # (so it did before: argparse knows -2)
    assert main(["plan", "--nodes", "-2"]) == 2
    assert capsys.readouterr().err.strip() == "zeppelin plan: error: --nodes must be >= 1, got -2"


def test_usage_errors_are_one_line_with_a_pointer_to_help(capsys):
    line = _one_line_error(capsys, ["plan", "--nodes", "x"])
    assert line == "zeppelin plan: error: argument --nodes: invalid int value: 'x' (zeppelin plan --help lists the flags)"


@pytest.mark.parametrize("command", ["advise", "plan", "demo"])
def test_unknown_flags_are_named_by_the_sub_command(capsys, command):
    line = _one_line_error(capsys, [command, "--bogus"])
    assert line.startswith(f"zeppelin {command}: error: unrecognized arguments: --bogus")


@pytest.mark.parametrize("argv, needle", [
    (["--ranks", "0"], "--ranks must be >= 1, got 0"),
    (["--steps", "0"], "--steps must be >= 1, got 0"),
    (["--steps", "-1"], "--steps must be >= 1, got -1"),
    (["--ranks", "3"], "--ranks 3 is not a whole number of nodes of --gpus-per-node 2"),
    (["--strategies", "zeppelin,bogus"], "--strategies: unknown strategy bogus"),
    (["--static-cp-size", "3"], "--static-cp-size 3 does not divide --ranks 4"),
    (["--model", "nope"], "--model"),
])
def test_demo_checks_every_flag_before_any_work(capsys, tmp_path, argv, needle):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), *argv]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("zeppelin demo: error:") and needle in err[0], err
    assert captured.out == "" and not out.exists()  # nothing printed, calibrated or written


def test_plan_output_paths_are_checked_before_planning(capsys, tmp_path, monkeypatch):
    import megatron_zeppelin.commands.plan as plan_cmd
    monkeypatch.setattr(plan_cmd, "load_source", lambda *a, **k: pytest.fail("sampled before the paths were checked"))
    for flag in ("--json", "--plot"):
        bad = tmp_path / "missing" / "out.file"
        assert main(["plan", "--model", "tiny", flag, str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"zeppelin plan: error: cannot write {flag} {bad}: no directory"), err
    assert main(["plan", "--model", "tiny", "--json", str(tmp_path)]) == 2
    assert "it is a directory" in capsys.readouterr().err


def test_simulate_output_paths_are_checked_first(capsys, tmp_path, monkeypatch):
    import megatron_zeppelin.data.workloads as workloads
    monkeypatch.setattr(workloads, "load_source", lambda *a, **k: pytest.fail("sampled before the paths were checked"))
    bad = tmp_path / "missing" / "g.png"
    assert main(["simulate", "--model", "tiny", "--gantt", str(bad)]) == 2
    assert "cannot write --gantt" in capsys.readouterr().err


def test_plan_into_a_closed_pipe_exits_quietly(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # More than a pipe's write buffer (8 KB) before the plot, so the reader sees the first line while the
    # command still has lines to write (the plot's), which then meet the closed pipe.
    p = subprocess.Popen([sys.executable, "-m", "megatron_zeppelin.cli", "plan", "--model", "tiny", "--gpus-per-node",
                          "4", "--nodes", "4", "--global-batch-tokens", "24K", "--context-length", "4K", "--dataset",
                          "github", "--compare", "--seeds", "2", "--explain", "--plot", str(tmp_path / "p.png")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    first = p.stdout.readline()  # as `| head -1` does: read one line, then go away
    p.stdout.close()
    try:
        _, err = p.communicate(timeout=300)
    finally:
        p.kill()
    assert first.startswith(b"dataset:")
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
    assert p.returncode in (0, 1)
