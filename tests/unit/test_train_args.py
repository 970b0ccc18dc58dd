"""``zeppelin train`` checks its flags before any rank starts: one line naming the flag, exit 2, nothing
written; token counts take K/M suffixes as plan's do."""

import os

import pytest

from megatron_zeppelin.cli import build_parser, main


def _run(tmp_path, capsys, *argv):
    before = sorted(os.listdir(tmp_path))
    rc = main(["train", *argv])
    err = capsys.readouterr().err.strip()
    assert sorted(os.listdir(tmp_path)) == before  # nothing written
    return rc, err


@pytest.mark.parametrize("argv,flag", [
    (["--train-iters", "-1"], "--train-iters -1: must be > 0"),
    (["--train-iters", "0"], "--train-iters 0: must be > 0"),
    (["--nproc", "-1"], "--nproc -1: must be >= 0"),
    (["--lr", "-1"], "--lr -1.0: must be > 0"),
    (["--global-batch-tokens", "0"], "--global-batch-tokens 0: must be > 0"),
    (["--min-lr-ratio", "2"], "--min-lr-ratio 2.0: must be between 0 and 1"),
    (["--save-interval", "5"], "--save-interval needs --save DIR"),
])
def test_bad_values_fail_up_front(tmp_path, capsys, argv, flag):
    rc, err = _run(tmp_path, capsys, *argv, "--save", str(tmp_path / "ckpt")) if argv[0] != "--save-interval" \
        else _run(tmp_path, capsys, *argv)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("zeppelin train: error: ") and flag in err, err


def test_unwritable_save_and_log_fail_up_front(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    rc, err = _run(tmp_path, capsys, "--save", str(blocker / "ckpt"))
    assert rc == 2 and "--save" in err and "not writable" in err and len(err.splitlines()) == 1, err
    rc, err = _run(tmp_path, capsys, "--save", str(blocker))
    assert rc == 2 and "--save" in err and "not a directory" in err, err
    rc, err = _run(tmp_path, capsys, "--log-jsonl", str(blocker / "m.jsonl"))
    assert rc == 2 and "--log-jsonl" in err, err


def test_an_old_log_is_refused_not_appended(tmp_path, capsys):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\n')
    rc, err = _run(tmp_path, capsys, "--log-jsonl", str(log))
    assert rc == 2 and "--log-jsonl" in err and "exists" in err and "--load" in err, err
    assert log.read_text() == '{"step": 1}\n'


def test_load_without_a_checkpoint_fails_up_front(tmp_path, capsys):
    rc, err = _run(tmp_path, capsys, "--load", str(tmp_path))
    assert rc == 2 and "--load" in err and "no checkpoint" in err, err


def test_token_counts_take_suffixes_like_plan():
    a = build_parser().parse_args(["train", "--global-batch-tokens", "32K", "--max-doc-tokens", "4k"])
    assert (a.global_batch_tokens, a.max_doc_tokens) == (32768, 4096)
    b = build_parser().parse_args(["plan", "--global-batch-tokens", "32K"])
    assert b.global_batch_tokens == a.global_batch_tokens


@pytest.mark.parametrize("argv,want", [
    ([], "none"),
    (["--recompute-granularity", "selective"], "selective:core_attn"),  # Megatron's default module
    (["--recompute-granularity", "selective", "--recompute-modules", "mlp", "core_attn"], "selective:core_attn,mlp"),
    (["--recompute-granularity", "full"], "full"),
    (["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"], "full:block=1"),
])
def test_megatrons_recompute_flags_reach_the_plans_and_the_model(argv, want):
    """The flags set the ZeppelinConfig the plans are priced with; the trainer builds the model with it."""
    from megatron_zeppelin.commands.train import options_from_args
    assert options_from_args(build_parser().parse_args(["train", "--zeppelin-balance", *argv])).zeppelin["recompute"] == want


def test_megatron_lm_args_set_the_recompute():
    from argparse import Namespace

    from megatron_zeppelin.integration.args import config_from_args
    from megatron_zeppelin.spec.recompute import Recompute, RecomputeError
    assert config_from_args(Namespace(recompute_granularity="selective", recompute_modules=None)).recompute == \
        Recompute("selective", ("core_attn",))
    with pytest.raises(RecomputeError, match="--recompute-modules"):
        config_from_args(Namespace(recompute_granularity="selective", recompute_modules=["moe"]))
    block = Namespace(recompute_granularity="full", recompute_method="block", recompute_num_layers=3)
    assert config_from_args(block).recompute.describe() == "full:block=3"  # only the first 3 layers rerun their forward
    uniform = Namespace(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    assert config_from_args(uniform).recompute == Recompute("full")


@pytest.mark.parametrize("balance", [[], ["--zeppelin-balance"]])
def test_pipeline_parallelism_points_at_the_megatron_lm_entry(tmp_path, capsys, balance):
    rc, err = _run(tmp_path, capsys, "--pipeline-model-parallel-size", "2", *balance)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "--pipeline-model-parallel-size 1" in err and "megatron_zeppelin.integration.pretrain_gpt" in err, err
    sub = build_parser()._subparsers._group_actions[0].choices["train"]
    assert "Megatron-LM entry" in " ".join(sub.format_help().split())


@pytest.mark.parametrize("how", ["joint", "by_length"])
def test_joint_accumulation_points_at_the_megatron_lm_entry(tmp_path, capsys, how):
    """rounds (the default) and data_order are the same at one micro-batch per step: train runs them."""
    rc, err = _run(tmp_path, capsys, "--zeppelin-balance", "--zeppelin-accumulation", how)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "--zeppelin-accumulation rounds" in err and "megatron_zeppelin.integration.pretrain_gpt" in err, err
    sub = build_parser()._subparsers._group_actions[0].choices["train"]
    assert "refuses joint and by_length" in " ".join(sub.format_help().split())
