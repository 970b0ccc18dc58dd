"""Pipeline parallelism through Megatron-LM's own ``pretrain()`` with ``--zeppelin-balance``.

PP 2 x DP 2 on 4 gloo ranks (CPU shim), 1F1B with several micro-batches per iteration (global batch
= 4 micro-batches of each DP rank): every stage plans each micro-batch from the same documents,
activations change shape per micro-batch (Megatron's variable_seq_lengths exchange), and loss, grad
norm and validation loss equal Megatron's stock layer spec under the same PP 2 x DP 2 (the stock
spec's weights are initialised per pipeline stage, so the reference runs the same parallel layout).
PP 2 x VPP 2 x DP 2 does the same with interleaved 1F1B (two model chunks per stage).
"""

import os
import re

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


@pytest.fixture(scope="module")
def slow_gemm(tmp_path_factory):
    """The h200 profile with slow GEMMs and free NVLink: on these tiny batches the MLP side is then
    worth balancing, so some plans remap, and a stage boundary follows a remap back."""
    return _gemm_profile(tmp_path_factory, 0.001)


@pytest.fixture(scope="module")
def slower_gemm(tmp_path_factory):
    """slow_gemm's profile with GEMMs 10x slower again: with 4 layers a remap pair costs relatively
    more (the last layer has one remap, not two), and at 0.001 no plan of these batches remaps."""
    return _gemm_profile(tmp_path_factory, 0.0001)


def _gemm_profile(tmp_path_factory, gemm_tflops: float) -> str:
    import yaml

    from megatron_zeppelin.spec.hardware import CLUSTERS_DIR

    with open(os.path.join(CLUSTERS_DIR, "h200.yaml")) as f:
        d = yaml.safe_load(f)
    d.update(name=f"h200-gemm-{gemm_tflops}", gemm_tflops=gemm_tflops)
    d["nvlink"].update(GBps=1e5, latency_us=0)
    path = tmp_path_factory.mktemp("profile") / f"gemm_{gemm_tflops}.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


def pp_train(data, tmp_path, name, ranks, extra, micro_batches=4):
    """``micro_batches`` micro-batches per iteration (global batch = that x DP x micro-batch size 1);
    DP 2 (with --tensor-model-parallel-size 2 on 8 ranks)."""
    dp = 2
    return train(data, tmp_path, name, ranks, PP2 + extra, iters=ITERS,
                 global_batch=micro_batches * dp)


def test_pp2_dp2_1f1b_matches_stock_spec(data, slow_gemm, tmp_path):
    ref, ref_log = pp_train(data, tmp_path, "stock", 4, ["--zeppelin-stock-spec"] + EVAL)
    run, log = pp_train(data, tmp_path, "zeppelin", 4, ZEPPELIN + EVAL + ["--zeppelin-cluster", slow_gemm])
    assert_same(run, ref, range(1, ITERS + 1))
    plans = m.plan_lines(log)
    # both stages planned every micro-batch (4 per iteration, and evaluation's), the same plans in
    # the same order (the stage check compared them too: a mismatch fails the run)
    by_stage = [[digest(p) for p in plans if f" stage={s} " in p] for s in (0, 1)]
    assert len(by_stage[0]) >= 4 * ITERS and by_stage[0] == by_stage[1], plans
    assert any("inter=0" not in p or "intra=0" not in p for p in plans), plans  # ring-split documents
    assert any("remap=True" in p for p in plans), plans  # stage 0's last layer remapped back
    val, ref_val = validation_losses(log), validation_losses(ref_log)
    assert val and len(val) == len(ref_val), (val, ref_val)
    assert all(abs(a - b) <= TOL * abs(b) for a, b in zip(val, ref_val)), (val, ref_val)


def digest(plan_line):
    # the 16 hex digits only: another rank's output can run on after them in the same line of the log
    return re.search(r"digest=([0-9a-f]{16})", plan_line).group(1)


@pytest.mark.slow  # ~40 s; test_pp2_dp2_1f1b_matches_stock_spec runs Megatron-LM's 1F1B in the default run
def test_pp2_vpp2_dp2_interleaved_matches_stock_spec(data, slower_gemm, tmp_path):
    """Interleaved 1F1B: 4 layers, each stage two model chunks of one layer, 4 micro-batches per
    iteration (a multiple of PP, as Megatron's interleaving needs). Each chunk reads the documents
    from its own iterator; a rank's first chunk takes each micro-batch's Plan, the second reuses it."""
    vpp = ["--num-layers", "4", "--num-layers-per-virtual-pipeline-stage", "1"]
    ref, ref_log = pp_train(data, tmp_path, "stock", 4, vpp + ["--zeppelin-stock-spec"] + EVAL)
    run, log = pp_train(data, tmp_path, "zeppelin", 4, vpp + ZEPPELIN + EVAL + ["--zeppelin-cluster", slower_gemm])
    assert_same(run, ref, range(1, ITERS + 1))
    plans = m.plan_lines(log)
    # every (stage, chunk) ran every micro-batch with the same plans in the same order; the second
    # chunk's came from the first chunk's, never planned again
    runs = {(s, c): [digest(p) for p in plans if f" stage={s} chunk={c} " in p] for s in (0, 1) for c in (0, 1)}
    assert len(runs[0, 0]) >= 4 * ITERS and all(r == runs[0, 0] for r in runs.values()), runs
    assert all("kept from chunk 0" in p for p in plans if " chunk=1 " in p), plans
    assert sum("planned ahead" in p for p in plans if " chunk=0 " in p) >= 4 * ITERS, plans
    assert any("remap=True" in p for p in plans), plans  # chunk boundaries follow a remap back
    val, ref_val = validation_losses(log), validation_losses(ref_log)
    assert val and len(val) == len(ref_val), (val, ref_val)
    assert all(abs(a - b) <= TOL * abs(b) for a, b in zip(val, ref_val)), (val, ref_val)


@pytest.mark.slow
def test_pp2_tp2_dp2_matches_stock_spec(data, slow_gemm, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # Megatron's validate_args demands it with TP
    # 8 ranks: each stage's domain is the 2 DP ranks of one TP rank. (No --sequence-parallel: the
    # stock local spec's torch norms refuse it, so there would be no reference.)
    tp = ["--tensor-model-parallel-size", "2"]
    ref, ref_log = pp_train(data, tmp_path, "stock", 8, tp + ["--zeppelin-stock-spec"] + EVAL)
    run, log = pp_train(data, tmp_path, "zeppelin", 8, tp + ZEPPELIN + EVAL + ["--zeppelin-cluster", slow_gemm])
    assert_same(run, ref, range(1, ITERS + 1))
    val, ref_val = validation_losses(log), validation_losses(ref_log)
    assert val and len(val) == len(ref_val), (val, ref_val)
    assert all(abs(a - b) <= TOL * abs(b) for a, b in zip(val, ref_val)), (val, ref_val)

def _stages(rank, world, lengths_by_rank):
    """Two 'stages' of one pipeline submit their plans of one micro-batch, then the phase ends."""
    from megatron_zeppelin.integration.plan_check import PlanMismatchError, StagePlanCheck
    from megatron_zeppelin.planner import plan_batch
    from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE
    from megatron_zeppelin.spec.config import ZeppelinConfig
    from megatron_zeppelin.spec.topology import Topology

    check = StagePlanCheck(range(world))
    plan = plan_batch(lengths_by_rank[rank], Topology(1, 2), TOY_PROFILE, TOY_MODEL, ZeppelinConfig(gpus_per_node=2))
    check.submit(plan, (0, True), "a training micro-batch of iteration 1")
    try:
        check.submit(plan, (1, True), "a training micro-batch of iteration 2")  # the next phase waits for the first
        check.wait()
    except PlanMismatchError as e:
        return str(e)
    return None


def test_stages_that_disagree_on_the_plan_all_fail_clearly():
    from megatron_zeppelin.distributed.launch import run_distributed

    assert run_distributed(_stages, 2, [[7, 3, 5], [7, 3, 5]], timeout=120) == [None, None]
    msgs = run_distributed(_stages, 2, [[7, 3, 5], [7, 3, 6]], timeout=120)  # stage 1 read another batch
    assert all(m is not None and "pipeline stages disagree on the plan of a training micro-batch of iteration 1"
               in m for m in msgs), msgs
