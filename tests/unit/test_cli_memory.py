"""plan --compare and memory (issue 56 item 6): every strategy that does not fit a GPU is marked, and the
default setup fits (the fastest recompute memory allows; the default batch shrinks when even full
recompute cannot hold it)."""

import json

from megatron_zeppelin.cli import main

A800 = ["--dataset", "prolong64k", "--cluster", "a800", "--model", "llama-7b", "--nodes", "4"]


def _run(capsys, tmp_path, *argv):
    j = tmp_path / "p.json"
    assert main(["plan", *argv, "--compare", "--json", str(j)]) == 0
    return capsys.readouterr().out, json.loads(j.read_text())


def test_no_recompute_marks_what_does_not_fit(capsys, tmp_path):
    out, doc = _run(capsys, tmp_path, *A800, "--global-batch-tokens", "1M", "--recompute", "none")
    assert doc["recompute"] == "none"
    for name, rec in doc["strategies"].items():
        m = rec["memory"]
        assert m["gpu_GB"] > m["limit_GB"] and not m["fits"], name  # 32K tokens per rank, no recompute: none fits
        row = next(x for x in out.splitlines() if x.strip().startswith(name + " "))
        assert row.rstrip().endswith("NO FIT"), row
    assert "NO FIT: zeppelin, packed_dp" in out
    assert "DOES NOT FIT" in out


def test_default_recompute_fits_and_says_why(capsys, tmp_path):
    out, doc = _run(capsys, tmp_path, *A800, "--global-batch-tokens", "512K")
    assert doc["recompute"] == "full"
    assert "memory: recompute full, the fastest with which 16384 tokens per rank fit" in out
    z = doc["strategies"]["zeppelin"]["memory"]
    assert z["fits"] and z["gpu_GB"] <= z["limit_GB"]
    assert doc["strategies"]["static_cp"]["memory"]["fits"]


def test_a_given_batch_that_cannot_fit_is_kept_and_said(capsys, tmp_path):
    out, doc = _run(capsys, tmp_path, *A800, "--global-batch-tokens", "1M")
    assert doc["batch"]["tokens"] == 1 << 20
    assert "do not fit 80 GB even with full recompute" in out


def test_the_default_batch_shrinks_to_what_memory_holds(capsys, tmp_path):
    out, doc = _run(capsys, tmp_path, "--cluster", "a800", "--model", "llama-7b", "--dataset", "arxiv")
    assert "the default batch (1048576 tokens) does not fit 8 ranks of 80 GB" in out
    assert doc["batch"]["tokens"] < 1 << 20
    assert doc["strategies"]["zeppelin"]["memory"]["fits"]


def test_small_models_keep_the_planners_default_capacity(capsys, tmp_path):
    # Plenty of memory: no recompute, and no capacity imposed (the plans are the ones made before --recompute).
    out, doc = _run(capsys, tmp_path, "--model", "tiny", "--cluster", "h200", "--gpus-per-node", "4",
                    "--global-batch-tokens", "24K", "--context-length", "4K", "--dataset", "github")
    assert doc["recompute"] == "none" and "memory: recompute none" in out
    assert "every strategy fits" in out
    from megatron_zeppelin.planner import plan_batch
    from megatron_zeppelin.spec.config import ZeppelinConfig
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.spec.model import load_model
    from megatron_zeppelin.spec.topology import Topology
    profile = load_profile("h200")
    topo = Topology(1, 4, min(4, profile.nics_per_node))
    plan = plan_batch(doc["batch"]["lengths"], topo, profile, load_model("tiny"),
                      ZeppelinConfig(gpus_per_node=4, nics_per_node=topo.nics_per_node, cluster="h200"))
    assert plan.digest() == doc["strategies"]["zeppelin"]["digest"]
