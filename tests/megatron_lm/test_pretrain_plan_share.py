"""--zeppelin-plan-sharing one-per-domain in Megatron-LM's own training loop: the domain's rank 0
plans each batch and broadcasts it (integration/plan_share.py); the run trains exactly as every
rank planning (loss and grad norm per iteration within rel. 1e-6), every batch planned ahead and
shared."""

import pytest

import mlm_run as m

PY = m.mlm_python()
pytestmark = [pytest.mark.megatron_lm, pytest.mark.slow,
              pytest.mark.skipif(PY is None, reason="no .venv-mlm (bash scripts/setup.sh makes it)")]
ITERS = 3
TOL = 1e-6
# 2 "nodes" x 2 ranks, documents split over rings (as tests/megatron_lm/test_pretrain.py)
ZEPPELIN = ["--zeppelin-balance", "--zeppelin-gpus-per-node", "2", "--zeppelin-capacity-tokens", str(m.SEQ * 5 // 4),
            "--zeppelin-debug-plan"]


def _train(data, work, sharing):
    work.mkdir(parents=True, exist_ok=True)
    flags = m.model_flags(data) + ["--train-iters", str(ITERS), "--global-batch-size", "8",
                                   "--tensorboard-dir", str(work / "tb"), "--zeppelin-plan-sharing", sharing] + ZEPPELIN
    log = m.run(PY, 4, flags, 600, str(work))
    return m.scalars(str(work / "tb")), log


def test_one_per_domain_trains_as_every_rank_planning(tmp_path):
    data = m.build_dataset(str(tmp_path / "docs"))
    shared, log = _train(data, tmp_path / "shared", "one-per-domain")
    every, every_log = _train(data, tmp_path / "every", "every-rank")
    for tag in ("lm loss", "grad-norm"):
        assert sorted(shared[tag]) == list(range(1, ITERS + 1)), (tag, shared[tag])
        for i in range(1, ITERS + 1):
            a, b = shared[tag][i], every[tag][i]
            assert abs(a - b) <= TOL * abs(b), f"{tag} at iteration {i}: shared {a} vs every rank {b}"
    plans = m.plan_lines(log)
    assert len(plans) >= 2 * ITERS and all("planned ahead" in p and "shared by rank 0" in p for p in plans), plans
    assert not any("shared by" in p for p in m.plan_lines(every_log))
