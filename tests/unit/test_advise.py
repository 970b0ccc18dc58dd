"""zeppelin advise on textbook cases."""

import pytest

from megatron_zeppelin.advise import AdviseError, advise, parse_memory
from megatron_zeppelin.cli import main
from megatron_zeppelin.model_spec import load_model
from megatron_zeppelin.profile import load_profile


def test_states_that_do_not_fit_get_higher_stage_or_tp():
    m, p = load_model("llama-30b"), load_profile("a800")
    a = advise([2048] * 64, m, p, nodes=2, gpu_memory_bytes=80e9, use_sim=False)
    assert a.best is not None and a.best.fits
    # ZeRO-1 at TP 1 would need > 80 GB for weights + grads alone
    z1 = [c for c in a.candidates if c.tp == 1 and c.zero_stage == 1 and c.recompute]
    assert z1 and not any(c.fits for c in z1)
    assert a.best.zero_stage >= 2 or a.best.tp > 1


def test_nothing_fits_says_so():
    a = advise([2048] * 64, load_model("llama-30b"), load_profile("a800"), nodes=1, gpu_memory_bytes=80e9,
               use_sim=False)
    assert a.best is None and "add --nodes" in a.reasons[0]


def test_small_model_gets_plain_ddp_and_packed_dp():
    a = advise([1024] * 64, load_model("tiny"), load_profile("h200"), nodes=1, gpu_memory_bytes=141e9)
    assert (a.best.zero_stage, a.best.tp, a.best.strategy, a.best.recompute) == (0, 1, "packed_dp", False)


def test_uniform_short_documents_get_packed_dp_without_cp():
    a = advise([2048] * 128, load_model("llama-3b"), load_profile("h200"), nodes=1, gpu_memory_bytes=141e9)
    assert a.best.strategy == "packed_dp" and a.best.classes["intra"] == a.best.classes["inter"] == 0


def test_long_tail_gets_a_balancing_strategy():
    lengths = [32768] * 3 + [2048] * 20 + [256] * 200
    a = advise(lengths, load_model("llama-7b"), load_profile("h200"), nodes=2, gpu_memory_bytes=141e9)
    assert a.best.strategy != "packed_dp"
    packed = [c for c in a.candidates if c.strategy == "packed_dp" and c.fits]
    assert all(c.iteration_s > a.best.iteration_s for c in packed)


def test_memory_flag_errors_name_the_flag():
    assert parse_memory("141GB") == 141e9
    with pytest.raises(AdviseError, match="--gpu-memory"):
        parse_memory("lots")


def test_cli_advise(capsys):
    assert main(["advise", "--model", "llama-7b", "--cluster", "c", "--nodes", "1", "--dataset", "fineweb",
                 "--global-batch-tokens", "256K", "--no-sim"]) == 0
    out = capsys.readouterr().out
    assert "recommend: TP" in out and "GiB per GPU" in out and "why:" in out
