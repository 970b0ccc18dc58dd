"""Pipeline parallelism through Megatron-LM's own ``pretrain()`` with ``--zeppelin-balance``.

PP 2 x DP 2 on 4 gloo ranks (CPU shim), 1F1B with several micro-batches per iteration (global batch
= 4 micro-batches of each DP rank): every stage plans each micro-batch from the same documents,
activations change shape per micro-batch (Megatron's variable_seq_lengths exchange), and loss, grad
norm and validation loss equal Megatron's stock layer spec under the same PP 2 x DP 2 (the stock
spec's weights are initialised per pipeline stage, so the reference runs the same parallel layout).
"""

import pytest

import mlm_run as m
from test_pretrain import EVAL, PY, TOL, ZEPPELIN, assert_same, train, validation_losses

pytestmark = [pytest.mark.megatron_lm,
              pytest.mark.skipif(PY is None, reason="no .venv-mlm (bash scripts/setup.sh makes it)")]
ITERS = 3
PP2 = ["--pipeline-model-parallel-size", "2"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return m.build_dataset(str(tmp_path_factory.mktemp("mlm_data") / "docs"))


def pp_train(data, tmp_path, name, ranks, extra, micro_batches=4):
    """``micro_batches`` micro-batches per iteration (global batch = that x DP x micro-batch size 1)."""
    dp = ranks // 2
    return train(data, tmp_path, name, ranks, PP2 + extra, iters=ITERS,
                 global_batch=micro_batches * dp)


def test_pp2_dp2_1f1b_matches_stock_spec(data, tmp_path):
    ref, ref_log = pp_train(data, tmp_path, "stock", 4, ["--zeppelin-stock-spec"] + EVAL)
    run, log = pp_train(data, tmp_path, "zeppelin", 4, ZEPPELIN + EVAL)
    assert_same(run, ref, range(1, ITERS + 1))
    plans = m.plan_lines(log)
    # both stages planned every micro-batch (4 per iteration, and evaluation's), the same plans in
    # the same order (the stage check compared them too: a mismatch fails the run)
    by_stage = [[digest(p) for p in plans if f" stage={s} " in p] for s in (0, 1)]
    assert len(by_stage[0]) >= 4 * ITERS and by_stage[0] == by_stage[1], plans
    assert any("inter=0" not in p or "intra=0" not in p for p in plans), plans
    val, ref_val = validation_losses(log), validation_losses(ref_log)
    assert val and len(val) == len(ref_val), (val, ref_val)
    assert all(abs(a - b) <= TOL * abs(b) for a, b in zip(val, ref_val)), (val, ref_val)


def digest(plan_line):
    return plan_line.split("digest=")[1].split()[0]
