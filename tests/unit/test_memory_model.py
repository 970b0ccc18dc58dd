"""The memory model: stage arithmetic, and against the peak memory measured on the CPU runs."""

import json
import os

import pytest

from megatron_zeppelin.spec.memory import activation_bytes_per_token, predict_memory
from megatron_zeppelin.spec.model import load_model


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


def test_block_recompute_keeps_the_other_layers_whole():
    """--recompute-method block over N of the 32 layers: N layers keep their input only, the rest
    everything, so the bytes fall linearly in N. At N = 31 the last layer's tensors are the peak
    that a recomputed layer's would be under full, with one input fewer; N >= 32 is full."""
    m = load_model("llama-7b")
    none, full = activation_bytes_per_token(m), activation_bytes_per_token(m, recompute="full")
    by_n = [activation_bytes_per_token(m, recompute=f"full:block={n}") for n in (1, 8, 16, 31, 32, 40)]
    assert none > by_n[0] > by_n[1] > by_n[2] > by_n[3]
    assert by_n[4] == by_n[5] == full == by_n[3] + m.hidden * m.dtype_bytes
    step = by_n[1] - by_n[2]  # 8 layers' worth
    assert by_n[0] - by_n[1] == pytest.approx(step * 7 / 8, rel=1e-3)


# Measured by `zeppelin compare-dp` (MemTracker, one step): tiny GPT, fp32, see docs/dp.md.
RESULTS = os.path.join(os.path.dirname(__file__), "..", "..", "results", "compare_dp", "compare_dp.json")


@pytest.mark.skipif(not os.path.exists(RESULTS), reason="run `zeppelin compare-dp` first")
def test_prediction_within_15_percent_of_measured_peak():
    rows = json.load(open(RESULTS))["rows"]
    errs = [r["mem_error"] for r in rows if r["mem_error"] is not None]
    assert errs and max(abs(e) for e in errs) < 0.15
