"""Rendered SLURM jobs: valid bash, the right flags for each mode, dry-run prints, logs collected."""

import os
import shlex
import subprocess

import pytest
import yaml

from megatron_zeppelin.cli import main
from megatron_zeppelin.slurm.jobs import ENV_SH, MODES, TEMPLATE, render_jobs
from megatron_zeppelin.slurm.results import collect, table
from megatron_zeppelin.spec.entries import PACKED_ENTRY, ZEPPELIN_ENTRY

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "megatron_zeppelin", "presets", "runs", "slurm_example.yaml")
CPU = os.path.join(REPO, "megatron_zeppelin", "presets", "runs", "slurm_cpu.yaml")


def _args(script: str):
    """The launcher's argument list, as bash would split it."""
    body = script.split("\nzeppelin_", 1)[1].split(" ", 1)[1].replace("\\\n", " ")
    return shlex.split(body)


def _flag(args, name, n=1):
    i = args.index(name)
    return args[i + 1:i + 1 + n]


def test_every_mode_renders_valid_bash(tmp_path):
    jobs = render_jobs(EXAMPLE, str(tmp_path))
    assert {j.mode for j in jobs} == set(MODES) and len(jobs) == 2 * len(MODES)
    for j in jobs:
        p = tmp_path / os.path.basename(j.path)
        p.write_text(j.script)
        subprocess.run(["bash", "-n", str(p)], check=True)


def test_flags_per_mode(tmp_path):
    jobs = {(j.name, j.mode): _args(j.script) for j in render_jobs(EXAMPLE, str(tmp_path))}
    z = jobs[("7b-arxiv-64k", "zeppelin")]
    assert z[:2] == ["-m", ZEPPELIN_ENTRY] and "--zeppelin-balance" in z
    assert _flag(z, "--zeppelin-cluster") == ["h200"] and "--context-parallel-size" not in z
    assert _flag(z, "--dataloader-type") == ["external"] and "--calculate-per-token-loss" in z
    dp = jobs[("7b-arxiv-64k", "dp")]
    assert dp[0].endswith("Megatron-LM/pretrain_gpt.py") and _flag(dp, "--context-parallel-size") == ["1"]
    assert "--zeppelin-balance" not in dp
    cp = jobs[("7b-arxiv-64k", "cp_p2p")]
    assert _flag(cp, "--context-parallel-size") == ["16"] and _flag(cp, "--cp-comm-type") == ["p2p"]
    h = jobs[("7b-arxiv-64k", "cp_a2a_p2p")]
    assert _flag(h, "--cp-comm-type") == ["a2a+p2p"]
    assert _flag(h, "--hierarchical-context-parallel-sizes", 2) == ["8", "2"]
    assert _flag(jobs[("7b-arxiv-64k", "cp_all_gather")], "--cp-comm-type") == ["all_gather"]
    tp = jobs[("13b-prolong-64k", "cp_a2a_p2p")]  # tp 2: 4 CP ranks fit in a node of 8 GPUs
    assert _flag(tp, "--tensor-model-parallel-size") == ["2"] and "--sequence-parallel" in tp
    assert _flag(tp, "--hierarchical-context-parallel-sizes", 2) == ["4", "2"]
    assert "--sequence-parallel" not in jobs[("13b-prolong-64k", "zeppelin")]
    # same model, data and tokens per iteration in every mode; stock jobs attend per document in THD
    # (cu_seqlens from the dataset's documents), never through a dense mask
    for mode in MODES:
        a = jobs[("7b-arxiv-64k", mode)]
        assert _flag(a, "--num-layers") == ["32"] and _flag(a, "--global-batch-size") == ["32"]
        assert _flag(a, "--data-path") == ["/data/arxiv_text_document"]
        assert "--reset-attention-mask" not in a
        if mode != "zeppelin":
            assert "--dataloader-inter-document-masking" in a and "--no-create-attention-mask-in-dataloader" in a


def test_tokens_per_iteration_are_equal_and_batches_divide(tmp_path):
    for j in render_jobs(EXAMPLE, str(tmp_path)):
        a = list(j.args)
        gbs, seq = int(_flag(a, "--global-batch-size")[0]), int(_flag(a, "--seq-length")[0])
        tp = int(_flag(a, "--tensor-model-parallel-size")[0])
        cp = 1 if "--context-parallel-size" not in a else int(_flag(a, "--context-parallel-size")[0])
        assert gbs % (j.world_size // (tp * cp)) == 0, (j.name, j.mode)
        assert gbs * seq == j.tokens_per_iteration
        assert f"tokens_per_iteration={j.tokens_per_iteration}" in j.script


def test_batch_not_divisible_names_the_key(tmp_path, capsys):
    bad = tmp_path / "m.yaml"
    bad.write_text(yaml.safe_dump({"runs": [{"name": "x", "model": "llama-7b", "nodes": 4, "cp": 16,
                                             "seq_length": "64K", "global_batch_tokens": "1M", "data_path": "/d"}]}))
    assert main(["slurm", "--matrix", str(bad), "--out", str(tmp_path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "global_batch_tokens" in err and "2097152" in err


@pytest.mark.parametrize("run, words", [
    ({"nodes": 2, "cp": 8}, "inside one node"),                       # 8 CP ranks fit a node: plain a2a
    ({"nodes": 4, "cp": 16, "tp": 1, "model": "tiny", "gpus_per_node": 4}, "KV heads"),  # 2 KV heads over 4
])
def test_hierarchical_cp_is_checked(tmp_path, capsys, run, words):
    bad = tmp_path / "m.yaml"
    r = {"name": "x", "model": "llama-7b", "seq_length": "64K", "global_batch_tokens": "4M", "data_path": "/d",
         "modes": ["cp_a2a_p2p"], **run}
    bad.write_text(yaml.safe_dump({"runs": [r]}))
    assert main(["slurm", "--matrix", str(bad), "--out", str(tmp_path), "--dry-run"]) == 2
    assert words in capsys.readouterr().err


def test_cpu_matrix_emulates_two_nodes(tmp_path):
    jobs = {j.mode: j for j in render_jobs(CPU, str(tmp_path))}
    assert set(jobs) == {"zeppelin", "dp"}
    for j in jobs.values():
        assert "#SBATCH --nodes=1" in j.script and "#SBATCH --ntasks=4" in j.script
        assert "--gpus-per-node" not in j.script and "zeppelin_srun " in j.script
        assert _flag(list(j.args), "--distributed-backend") == ["gloo"] and "--bf16" not in j.args
    assert jobs["zeppelin"].entry == f"-m {ZEPPELIN_ENTRY}"
    assert jobs["dp"].entry == f"-m {PACKED_ENTRY}"  # no checkout named: the package's packed entry
    assert _flag(list(jobs["zeppelin"].args), "--zeppelin-gpus-per-node") == ["2"]
    assert "--zeppelin-balance" not in jobs["dp"].args and "--reset-attention-mask" in jobs["dp"].args


def test_template_and_entries_ship_in_the_package(tmp_path):
    """What a job sources and runs is inside the package (a wheel install has it), never scripts/."""
    pkg = os.path.join(REPO, "megatron_zeppelin")
    for path in (TEMPLATE, ENV_SH):
        assert os.path.commonpath([path, pkg]) == pkg and os.path.exists(path)
    for j in render_jobs(CPU, str(tmp_path)):
        assert f"source {ENV_SH}\n" in j.script and "scripts/" not in j.script


def test_matrix_by_preset_name(tmp_path, capsys):
    """A bare preset name finds presets/runs/ from any directory (a wheel install has no checkout)."""
    assert [j.path for j in render_jobs("slurm_cpu", str(tmp_path))] == [j.path for j in render_jobs(CPU, str(tmp_path))]
    assert main(["slurm", "--matrix", "slurm_example", "--out", str(tmp_path / "jobs"), "--dry-run",
                 "--no-check"]) == 0  # the example's data and checkout are placeholders
    assert capsys.readouterr().out.count("sbatch ") == 10
    assert main(["slurm", "--matrix", "no_such_preset", "--dry-run"]) == 2


def test_dry_run_prints_commands(tmp_path, capsys):
    # the example's data and Megatron-LM checkout are placeholders: render without the pre-submit checks
    assert main(["slurm", "--matrix", EXAMPLE, "--out", str(tmp_path / "jobs"), "--dry-run", "--no-check"]) == 0
    out = capsys.readouterr().out
    assert out.count("sbatch ") == 10 and (tmp_path / "jobs" / "7b-arxiv-64k-zeppelin.sbatch").exists()


def test_bad_matrix_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "m.yaml"
    bad.write_text(yaml.safe_dump({"runs": [{"name": "x", "model": "llama-7b", "nodes": 2, "cp": 3,
                                             "data_path": "/d", "modes": ["cp_p2p"]}]}))
    assert main(["slurm", "--matrix", str(bad), "--out", str(tmp_path), "--dry-run"]) == 2
    assert "cp 3" in capsys.readouterr().err
    assert main(["slurm", "--matrix", str(tmp_path / "missing.yaml"), "--dry-run"]) == 2


def test_collect_logs(tmp_path):
    log = ("[zeppelin-slurm] run=r mode=zeppelin nodes=2 gpus_per_node=8 world=16 tokens_per_iteration=2000\n" +
           "".join(f" iteration {i:>8}/      10 | elapsed time per iteration (ms): {1000 + i:.1f} | "
                   f"lm loss: {9 - i * 0.1:.3f} |\n" for i in range(1, 11)))
    (tmp_path / "r-zeppelin-1.log").write_text(log)
    (tmp_path / "other.log").write_text("no header here")
    recs = collect(str(tmp_path), warmup=3)
    assert len(recs) == 1 and recs[0]["iterations"] == 7
    assert recs[0]["iteration_s"] == pytest.approx(1.007) and recs[0]["strategy"] == "zeppelin"
    assert recs[0]["tokens_per_s"] == pytest.approx(2000 / 1.007, abs=0.1)
    assert "tokens/s" in table(recs) and "1986.1" in table(recs)
