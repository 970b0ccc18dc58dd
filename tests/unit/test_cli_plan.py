"""``zeppelin plan`` through megatron_zeppelin.cli.main: output, JSON, PNG, and bad inputs."""

import json

import numpy as np
import pytest

from megatron_zeppelin.cli import main
from megatron_zeppelin.config import STRATEGIES

SMALL = ["--model", "tiny", "--cluster", "h200", "--gpus-per-node", "4", "--global-batch-tokens", "24K",
         "--context-length", "4K", "--dataset", "github"]


def _run(capsys, *argv):
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_plan_prints_classes_ranks_and_bounds(capsys):
    rc, out, err = _run(capsys, *SMALL, "--strategy", "packed_dp", "--seed", "1")
    assert rc == 0, err
    for needle in ("documents", "24576 tokens", "thresholds:", "local", "intra", "inter", "attention s",
                   "comm s", "remap s", "imbalance (max/mean)", "lower bound", "ratio to lower bound"):
        assert needle in out, needle
    assert out.count("\n 3 ") + out.count("\n3 ") >= 1  # every rank listed for a small domain


def test_plan_many_ranks_are_summarized(capsys):
    rc, out, err = _run(capsys, *SMALL, "--strategy", "packed_dp", "--nodes", "5")
    assert rc == 0, err
    assert "summary" in out and "\n min " in out and "\n max " in out and "= 20 ranks" in out


def test_compare_json_and_plot(capsys, tmp_path):
    j, png = tmp_path / "plan.json", tmp_path / "plan.png"
    rc, out, err = _run(capsys, *SMALL, "--nodes", "2", "--compare", "--json", str(j), "--plot", str(png))
    assert rc == 0, err
    assert "all strategies on the same batch" in out
    doc = json.loads(j.read_text())
    assert set(doc["strategies"]) == set(STRATEGIES)
    for name, rec in doc["strategies"].items():
        assert "error" not in rec, (name, rec)
        assert rec["predicted_iteration_s"] > 0 and rec["imbalance"] >= 1.0
        assert rec["ratio_to_lower_bound"] == pytest.approx(rec["predicted_iteration_s"] / doc["lower_bound_s"])
        assert len(rec["per_rank"]["total_s"]) == 8
        assert sum(rec["per_rank"]["attention_tokens"]) == 24576
        assert rec["zeppelin_speedup"] > 0
        # The table prints the Plan's own numbers.
        assert f"{rec['imbalance']:.3f}" in out
    assert doc["strategies"]["zeppelin"]["zeppelin_speedup"] == pytest.approx(1.0)
    assert set(doc["thresholds"]) >= {"local_max", "intra_max", "reason"}
    assert doc["batch"]["tokens"] == 24576 and sum(doc["batch"]["lengths"]) == 24576
    assert doc["batch"]["documents"] == len(doc["batch"]["lengths"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_explain_prints_crossovers_and_routing(capsys):
    rc, out, err = _run(capsys, *SMALL, "--strategy", "packed_dp", "--nodes", "2", "--explain")
    assert rc == 0, err
    assert "why these thresholds" in out
    assert "ring of    2 inside a node (NVLink): hides its transfer from L >=" in out
    assert "over 2 nodes, direct" in out and "No document spans nodes" in out
    assert "routed over" in out  # planner.routing.explain_step


def test_flags_reach_the_planner(capsys, tmp_path):
    f = tmp_path / "l.txt"
    f.write_text("4000 3000 100 100 50\n")
    j = tmp_path / "p.json"
    rc, out, err = _run(capsys, "--dataset", str(f), "--global-batch-tokens", "0", "--context-length", "0",
                        "--model", "tiny", "--gpus-per-node", "2", "--strategy", "static_cp", "--cp-size", "2",
                        "--no-remap", "--routing", "off", "--json", str(j))
    assert rc == 0, err
    doc = json.loads(j.read_text())
    assert doc["batch"]["lengths"] == [4000, 3000, 100, 100, 50]
    assert doc["config"] == {"routing": "off", "remap": False, "cp_size": 2, "capacity_tokens": 0, "tp": 1}
    assert doc["strategies"]["static_cp"]["classes"]["intra"]["documents"] == 5


def _bad(capsys, tmp_path, argv, needle):
    rc, out, err = _run(capsys, *argv)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("zeppelin plan: error:")
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize("content, needle", [("100\n-5\n", "--dataset"), ("100\n0\n", "--dataset"),
                                             ("", "--dataset"), ("12 x\n", "--dataset")])
def test_bad_length_files(capsys, tmp_path, content, needle):
    f = tmp_path / "lengths.txt"
    f.write_text(content)
    _bad(capsys, tmp_path, ["--dataset", str(f), "--model", "tiny"], needle)


def test_bad_inputs(capsys, tmp_path):
    _bad(capsys, tmp_path, ["--dataset", "wikipedia-ish"], "unknown dataset preset 'wikipedia-ish'")
    _bad(capsys, tmp_path, ["--cluster", "z900"], "set --cluster")
    prof = tmp_path / "prof.yaml"
    prof.write_text("name: broken\ngemm_tflops: 100\n")
    _bad(capsys, tmp_path, ["--cluster", str(prof)], "malformed profile")
    prof.write_text("name: [unclosed\n")
    _bad(capsys, tmp_path, ["--cluster", str(prof)], "malformed profile")
    _bad(capsys, tmp_path, ["--world-size", "12", "--gpus-per-node", "8"], "--zeppelin-gpus-per-node")
    _bad(capsys, tmp_path, ["--model", "llama-999b"], "set --model")
    f = tmp_path / "long.txt"
    f.write_text("1000 10\n")
    _bad(capsys, tmp_path, ["--dataset", str(f), "--global-batch-tokens", "0", "--context-length", "0",
                            "--model", "tiny", "--gpus-per-node", "2", "--capacity-tokens", "100",
                            "--strategy", "packed_dp"], "capacity-tokens to at least 500")
    _bad(capsys, tmp_path, ["--dataset", "arxiv", "--global-batch-tokens", "0"], "--global-batch-tokens")


def test_bad_token_suffix_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--global-batch-tokens", "1Q"])
    assert e.value.code == 2
    assert "not a token count" in capsys.readouterr().err


def test_npy_dataset_end_to_end(capsys, tmp_path):
    f = tmp_path / "l.npy"
    np.save(f, np.array([3000, 1000, 500, 200, 90, 33]))
    rc, out, err = _run(capsys, "--dataset", str(f), "--global-batch-tokens", "3K", "--model", "tiny",
                        "--gpus-per-node", "2", "--strategy", "packed_dp", "--seed", "7")
    assert rc == 0, err
    assert "3072 tokens" in out
