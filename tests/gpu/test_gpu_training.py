"""GPU check (skipped without CUDA): one training step of the tiny GPT with the Zeppelin spec on
NCCL equals the stock model on one CPU process running each document alone.

Run on a GPU machine with `python -m pytest -m gpu tests/gpu`.
"""

import importlib.util
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "megatron"))

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              # the GPU machine has no megatron-core: its wheel travels in .whl/ (scripts/gpu_check.sh)
              pytest.mark.skipif(importlib.util.find_spec("megatron") is None,
                                 reason="megatron-core not installed (carry its wheel in .whl/)")]

TOL = 1e-4  # float32 on GPU kernels vs the CPU oracle (TF32 off by default in torch matmuls)


def test_one_step_on_gpu_equals_one_process():
    import zp_workers as w

    from megatron_zeppelin.distributed.launch import run_distributed
    ref = run_distributed(w.reference_run, 1, 1, timeout=300)[0]
    res = run_distributed(w.zeppelin_run, 1, 1, 1, ["zeppelin", "packed_dp"], 1, "real", ref["init"],
                          backend="nccl", timeout=600)[0]
    for strategy in ("zeppelin", "packed_dp"):
        r = res[strategy]
        assert abs(r["losses"][0] - ref["losses"][0]) <= TOL * abs(ref["losses"][0]), strategy
        for name, g in ref["grads"][0].items():
            assert np.linalg.norm(r["grads"][0][name] - g) <= TOL * np.linalg.norm(g), (strategy, name)
