"""``zeppelin plan`` through megatron_zeppelin.cli.main: output, JSON, PNG, and bad inputs."""

import json

import numpy as np
import pytest

from megatron_zeppelin.cli import main
from megatron_zeppelin.spec.config import STRATEGIES

SMALL = ["--model", "tiny", "--cluster", "h200", "--gpus-per-node", "4", "--global-batch-tokens", "24K",
         "--context-length", "4K", "--dataset", "github"]


def _run(capsys, *argv):
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_plan_prints_classes_ranks_and_bounds(capsys):
    rc, out, err = _run(capsys, *SMALL, "--strategy", "packed_dp", "--seed", "1")
    assert rc == 0, err
    for needle in ("documents", "24576 tokens", "thresholds: no cost-model crossovers for packed_dp (", "classes the plan chose", "local", "intra", "inter", "attention s",
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
    _bad(capsys, tmp_path, ["--world-size", "12", "--gpus-per-node", "8"], "--gpus-per-node")
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


@pytest.mark.parametrize("argv, needle", [
    (["--nodes", "0"], "--nodes must be >= 1, got 0"),
    (["--gpus-per-node", "0"], "--gpus-per-node must be >= 1, got 0"),
    (["--nics-per-node", "0"], "--nics-per-node must be >= 1, got 0"),
    (["--world-size", "0"], "--world-size must be >= 1"),
    (["--tp", "0"], "--tp/--tensor-model-parallel-size must be >= 1"),
    (["--model", "llama-7b", "--tp", "3"], "--tp 3 does not divide llama-7b's 32 attention heads"),
    (["--model", "tiny", "--tensor-model-parallel-size", "4", "--gpus-per-node", "6"], "--tp 4 does not divide"),
    (["--seeds", "0"], "--seeds must be >= 1"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--ranks", "0"], "--ranks must be >= 1"),
    (["--cp-size", "-2"], "--cp-size must be >= 0"),
    (["--global-batch-size", "0"], "--global-batch-size must be >= 1"),
    (["--micro-batch-size", "-1"], "--micro-batch-size must be >= 1"),
    (["--global-batch-size", "4", "--global-batch-tokens", "1M"], "not both"),
    (["--micro-batch-size", "1", "--global-batch-size", "3", "--gpus-per-node", "4"],
     "--global-batch-size 3 is not a multiple of --micro-batch-size 1 x 4"),
    (["--global-batch-size", "4", "--seq-length", "0"], "set --seq-length > 0"),
    (["--tokenizer", "HuggingFaceTokenizer"], "--tokenizer-model"),
    (["--tokenizer", "GPT2BPETokenizer"], "--vocab-file"),
    (["--tokenizer", "/nonexistent/tok"], "--tokenizer /nonexistent/tok"),
])
def test_nonsense_flags_are_one_line_errors_and_write_nothing(capsys, tmp_path, argv, needle):
    j, png = tmp_path / "p.json", tmp_path / "p.png"
    sized = any(f in argv for f in ("--global-batch-size", "--micro-batch-size", "--global-batch-tokens"))
    small = [] if sized else ["--global-batch-tokens", "64K"]
    _bad(capsys, tmp_path, [*argv, *small, "--json", str(j), "--plot", str(png)], needle)
    assert not j.exists() and not png.exists()


def test_tp_layout_is_printed_and_planned_per_tp_group(capsys, tmp_path):
    j = tmp_path / "p.json"
    rc, out, err = _run(capsys, "--cluster", "h200", "--nodes", "4", "--tp", "2", "--global-batch-tokens", "256K",
                        "--json", str(j))
    assert rc == 0, err
    assert ("GPUs: 32 GPUs = 4 node(s) x 8 GPUs; TP 2 -> 16 domain ranks (4 per node, each a TP group of 2 GPUs)"
            in out)
    doc = json.loads(j.read_text())
    assert doc["gpus"] == {"total": 32, "gpus_per_node": 8, "tp": 2, "domain_ranks": 16}
    assert len(doc["strategies"]["zeppelin"]["per_rank"]["total_s"]) == 16


def test_megatron_flag_names(capsys, tmp_path):
    j = tmp_path / "p.json"
    rc, out, err = _run(capsys, "--data-path", "github", "--seq-length", "4K", "--global-batch-size", "6",
                        "--model", "tiny", "--gpus-per-node", "4", "--tensor-model-parallel-size", "2",
                        "--json", str(j))
    assert rc == 0, err
    doc = json.loads(j.read_text())
    assert doc["batch"]["tokens"] == 6 * 4096 and doc["batch"]["context_length"] == 4096
    assert doc["batch"]["max"] <= 4096 and doc["config"]["tp"] == 2
    assert "--global-batch-size 6 x --seq-length 4096 = 24576 tokens" in out
    rc, out, err = _run(capsys, "--data-path", "github", "--seq-length", "2K", "--micro-batch-size", "2",
                        "--global-batch-size", "16", "--model", "tiny", "--gpus-per-node", "4", "--json", str(j))
    assert rc == 0, err
    assert json.loads(j.read_text())["batch"]["tokens"] == 2 * 2048 * 4
    assert "is 2 such step(s) per iteration" in out


def test_thresholds_are_crossovers_and_classes_are_what_the_plan_chose(capsys, tmp_path):
    j = tmp_path / "p.json"
    rc, out, err = _run(capsys, "--dataset", "github", "--cluster", "h200", "--nodes", "2", "--json", str(j))
    assert rc == 0, err
    doc = json.loads(j.read_text())
    th, cls = doc["thresholds"], doc["strategies"]["zeppelin"]["classes"]
    assert f"documents <= {th['local_max']} tokens always stay whole" in out
    assert f"from {th['intra_max'] + 1} tokens over nodes" in out
    # The classes table: the lengths the plan chose (local documents longer than the crossover).
    assert cls["local"]["max"] > th["local_max"]
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("local "))
    assert row[1:5] == [str(cls["local"][k]) for k in ("documents", "tokens", "min", "max")]


def test_plot_shades_only_classes_with_documents(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from megatron_zeppelin.commands.plan import make_plans
    from megatron_zeppelin.spec.model import load_model
    from megatron_zeppelin.plots import plan as plot_mod
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.spec.topology import Topology
    from megatron_zeppelin.spec.config import ZeppelinConfig
    from megatron_zeppelin.data.workloads import sample_batch
    prof, model = load_profile("h200"), load_model("llama-7b")
    topo = Topology(2, 8, 8, prof.gpu_to_nic)
    lengths = sample_batch("github", 1 << 20, 0, 65536)
    plan = make_plans(lengths.tolist(), topo, prof, model, ZeppelinConfig(gpus_per_node=8, nics_per_node=8),
                      ("zeppelin",))["zeppelin"]
    assert plan.class_counts()["inter"] == 0
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    plot_mod._histogram(ax, lengths, plan)
    labels = ax.get_legend_handles_labels()[1]
    plt.close(fig)
    assert not any(lb.startswith("inter") for lb in labels), labels
    assert any(lb.startswith("local: ") for lb in labels) and any(lb.startswith("intra: ") for lb in labels)


def test_seeds_report_mean_and_spread(capsys, tmp_path):
    j = tmp_path / "p.json"
    rc, out, err = _run(capsys, *SMALL, "--compare", "--seeds", "3", "--json", str(j))
    assert rc == 0, err
    assert "over 3 sampled batches (seeds 0..2)" in out
    s = json.loads(j.read_text())["seeds"]
    assert s["count"] == 3
    z = s["strategies"]["zeppelin"]
    assert z["predicted_iteration_s"]["n"] == 3
    assert z["predicted_iteration_s"]["min"] <= z["predicted_iteration_s"]["mean"] <= z["predicted_iteration_s"]["max"]
    assert z["zeppelin_speedup"]["mean"] == pytest.approx(1.0)
    # the first seed's batch is the one shown in detail: same as a single-seed run
    rc, out1, err = _run(capsys, *SMALL, "--compare")
    assert out1.split("over 3")[0] in out


def test_token_suffixes_everywhere():
    from megatron_zeppelin.cli import build_parser
    p = build_parser()
    a = p.parse_args(["train", "--global-batch-tokens", "32K", "--max-doc-tokens", "4k", "--zeppelin-capacity-tokens", "1M"])
    assert (a.global_batch_tokens, a.max_doc_tokens, a.zeppelin_capacity_tokens) == (32768, 4096, 1 << 20)
    a = p.parse_args(["simulate", "--seq-length", "32K", "--global-batch-tokens", "1M"])
    assert (a.context_length, a.global_batch_tokens) == (32768, 1 << 20)
    for cmd in ("demo", "compare_dp"):
        a = p.parse_args([cmd, "--global-batch-tokens", "8K", "--max-doc-tokens", "1k"])
        assert (a.global_batch_tokens, a.max_doc_tokens) == (8192, 1024)
    a = p.parse_args(["advise", "--global-batch-tokens", "2M", "--context-length", "32K"])
    assert (a.global_batch_tokens, a.context_length) == (2 << 20, 32768)
    a = p.parse_args(["calibrate", "--lengths", "1K", "4k"])
    assert a.lengths == [1024, 4096]


def test_every_plan_reports_its_activation_memory_and_balance_memory_caps_it(capsys, tmp_path):
    j = tmp_path / "plan.json"
    rc, out, err = _run(capsys, *SMALL, "--nodes", "2", "--compare", "--json", str(j))
    assert rc == 0, err
    line = next(x for x in out.splitlines() if x.startswith("activation memory per rank"))
    assert "max/mean" in line and "balance-memory" not in line
    assert "memory imbalance" in out  # the --compare table's column
    doc = json.loads(j.read_text())
    assert all(s["memory_imbalance"] >= 1.0 and s["peak_activation_GB"] > 0
               for s in doc["strategies"].values() if "error" not in s)
    rc, out, err = _run(capsys, *SMALL, "--nodes", "2", "--zeppelin-balance-memory")
    assert rc == 0, err
    line = next(x for x in out.splitlines() if x.startswith("activation memory per rank"))
    imbalance = float(line.split("max/mean ")[1].split(";")[0])
    assert imbalance <= 1.10 + 1e-9 and "(--zeppelin-balance-memory)" in line
