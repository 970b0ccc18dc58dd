"""The memory model: stage arithmetic, and against the peak memory measured on the CPU runs."""

import json
import os

import pytest

from megatron_zeppelin.dp.memory import activation_bytes_per_token, predict_memory
from megatron_zeppelin.model_spec import load_model


def test_zero_stages_divide_what_they_shard():
    m = load_model("llama-7b")
    p = [predict_memory(m, 4096, dp=8, zero_stage=s) for s in range(4)]
    P = m.params()
    assert p[0].optimizer == int(P * 12) and p[1].optimizer == int(P * 12 / 8)
    assert p[1].gradients == int(P * 4) and p[2].gradients == int(P * 4 / 8)
    assert p[2].weights == int(P * 2) and p[3].weights == int(P * 2 / 8)
    assert p[0].total > p[1].total > p[2].total > p[3].total
    assert predict_memory(m, 4096, tp=2).weights == int(P / 2 * 2)


def test_recompute_keeps_far_fewer_activations():
    m = load_model("llama-7b")
    assert activation_bytes_per_token(m, recompute=True) * 4 < activation_bytes_per_token(m)


# Measured by `zeppelin compare-dp` (MemTracker, one step): tiny GPT, fp32, see docs/dp.md.
RESULTS = os.path.join(os.path.dirname(__file__), "..", "..", "results", "compare_dp", "compare_dp.json")


@pytest.mark.skipif(not os.path.exists(RESULTS), reason="run `zeppelin compare-dp` first")
def test_prediction_within_15_percent_of_measured_peak():
    rows = json.load(open(RESULTS))["rows"]
    errs = [r["mem_error"] for r in rows if r["mem_error"] is not None]
    assert errs and max(abs(e) for e in errs) < 0.15
