"""``--zeppelin-accumulation joint``, ``by_length`` and ``rounds`` through Megatron-LM's own ``pretrain()`` (issues 49
and 52).

An iteration of 4 micro-batches per DP rank: the joint run trains the same documents per iteration as
the data-order run, only regrouped over its micro-batches by the planner (planner/accumulation.py,
integration/data.py JointBatches), so with ``--calculate-per-token-loss`` each iteration's loss (the
sum over its micro-batches over their token count), grad norm and validation loss equal the
data-order run's up to float summation order (rel. 1e-5). DP 4 (2 nodes x 2) and PP 2 x DP 2 (1F1B,
every stage regrouping alike); by_length (documents of like length together) and rounds (packed as
Megatron's dynamic-CP scheduler packs its rounds) at DP 4; in the default run, rounds at DP 2 where
fewer rounds than Megatron's steps leave steps empty.
"""

import re

import pytest

import mlm_run as m
from test_pretrain import EVAL, PY, TOL, ZEPPELIN, assert_same, train, validation_losses

pytestmark = [pytest.mark.megatron_lm,
              pytest.mark.skipif(PY is None, reason="no .venv-mlm (bash scripts/setup.sh makes it)")]
ITERS = 3
MICRO = 4  # micro-batches per iteration (global batch = MICRO x DP x micro-batch size 1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return m.build_dataset(str(tmp_path_factory.mktemp("mlm_data") / "docs"))


def _both(data, tmp_path, ranks, dp, extra, how="joint"):
    gbs = MICRO * dp
    ref, ref_log = train(data, tmp_path, "data_order", ranks,
                         ZEPPELIN + EVAL + ["--zeppelin-accumulation", "data_order"] + extra, iters=ITERS, global_batch=gbs)
    run, log = train(data, tmp_path, how, ranks, ZEPPELIN + EVAL + ["--zeppelin-accumulation", how] + extra,
                     iters=ITERS, global_batch=gbs)
    assert_same(run, ref, range(1, ITERS + 1))
    val, ref_val = validation_losses(log), validation_losses(ref_log)
    assert val and len(val) == len(ref_val), (val, ref_val)
    assert all(abs(a - b) <= TOL * abs(b) for a, b in zip(val, ref_val)), (val, ref_val)
    return log, ref_log


def _regroupings(log, how="joint"):
    """(data-order tokens, regrouped tokens, skew before, skew after) of each ``zeppelin <how>:`` line."""
    pat = ("zeppelin " + how + r": \d+ micro-batches, tokens ([\d,]+) -> ([\d,]+), "
           r"predicted work max/mean ([\d.]+) -> ([\d.]+)")
    return re.findall(pat, log)


def _digests(log, stage=None):
    return [p.split("digest=")[1].split()[0] for p in m.plan_lines(log) if stage is None or f" stage={stage} " in p]


def _check_regrouped(log, ref_log, stage=None, how="joint"):
    groups = _regroupings(log, how)
    assert len(groups) >= ITERS, log[-3000:]  # once per training iteration (and evaluation's)
    assert not _regroupings(ref_log, how)
    # every regrouping keeps the iteration's tokens; joint never predicts more skew than data order
    assert all(sum(map(int, a.split(","))) == sum(map(int, b.split(","))) for a, b, _, _ in groups), groups
    assert how != "joint" or all(float(after) <= float(before) for _, _, before, after in groups), groups
    # the micro-batches were planned as regrouped: other plans than data order's, as many of them
    joint, order = _digests(log, stage), _digests(ref_log, stage)
    assert len(joint) == len(order) >= MICRO * ITERS and joint != order, (joint, order)
    # every plan was made ahead on the worker while the micro-batch before it trained
    assert all("planned ahead" in p for p in m.plan_lines(log)), m.plan_lines(log)


@pytest.mark.slow  # the PP 2 x DP 2 case below runs the same regrouping (-m slow)
def test_joint_equals_data_order_dp4(data, tmp_path):
    log, ref_log = _both(data, tmp_path, 4, 4, [])
    _check_regrouped(log, ref_log)


@pytest.mark.slow  # ~45 s; tests/unit/test_joint_batches.py runs _joint, test_pipeline.py PP 2 x DP 2 by default
def test_joint_equals_data_order_pp2_dp2(data, tmp_path):
    log, ref_log = _both(data, tmp_path, 4, 2, ["--pipeline-model-parallel-size", "2"])
    _check_regrouped(log, ref_log, stage=0)
    assert _digests(log, 0) == _digests(log, 1)  # both stages planned the same regrouped micro-batches


# all -m slow: the default run's Megatron-LM runs (test_pretrain.py, test_pipeline.py) take the default rounds
@pytest.mark.parametrize("how", [pytest.param("by_length", marks=pytest.mark.slow), pytest.param("rounds", marks=pytest.mark.slow)])
def test_regrouped_equals_data_order_dp4(data, tmp_path, how):
    """by_length and rounds differ only in which indices they hand JointBatches (unit-tested in
    tests/unit/test_joint_accumulation.py)."""
    log, ref_log = _both(data, tmp_path, 4, 4, [], how=how)
    _check_regrouped(log, ref_log, how=how)


def test_rounds_fewer_than_steps_run_empty_steps_equal_to_data_order_dp2(data, tmp_path):
    """Where fewer rounds hold an iteration than Megatron's k forward steps (here each rank is a node
    of its own, so a round is filled to hold the longest document on one rank: planner/accumulation.py
    ``round_fill``), the first steps run empty (no Plan, no layer: megatron_lm.py ``_empty_step``) and
    the losses, grad norms and validation losses are still data order's."""
    extra = ["--zeppelin-gpus-per-node", "1", "--zeppelin-capacity-tokens", str(4 * m.SEQ)]
    log, ref_log = _both(data, tmp_path, 2, 2, extra, how="rounds")
    empty = log.count("zeppelin empty micro-batch")
    assert empty > 0 and "zeppelin empty micro-batch" not in ref_log, log[-3000:]
    # every step that trains was planned (ahead, on the worker); the empty ones were not
    assert len(_digests(log)) + empty == len(_digests(ref_log)), (len(_digests(log)), empty, len(_digests(ref_log)))
    assert all("planned ahead" in p for p in m.plan_lines(log)), m.plan_lines(log)
