"""The bench stops simulating a setting once it can be neither deployed nor any batch's oracle
(sim/dominated.py): every number of every record is the same as when all run to the end."""

import pytest

from megatron_zeppelin.sim.dominated import Dominated

SKIP = {"plan_s", "sim_s", "tried", "dominated"}  # the clock, and the settings that stopped early


def _spec(**kw):
    from megatron_zeppelin.sim.runs import RunSpec
    base = dict(study="t", cluster="a800", model="tiny", tp=1, dataset="github", context=4096, nodes=1,
                tokens_per_gpu=1024, batches=2)
    return RunSpec(**{**base, **kw})


@pytest.mark.parametrize("micro_batches, stages", [(1, 1), (2, 1), (4, 2)])
def test_settings_stopped_early_change_no_record(monkeypatch, micro_batches, stages):
    """One micro-batch, gradient accumulation, and 1F1B over two stages (each stage's domain 8 ranks)."""
    from megatron_zeppelin.sim.runs import run_config
    spec = _spec(global_batch_tokens=micro_batches * 1024 * 8 if micro_batches > 1 else 0, micro_batches=micro_batches,
                 nodes=stages, pipeline=stages)
    variants = ("zeppelin", "static_cp", "allgather_cp", "dynamic_cp")
    pruned = run_config(spec, variants, cp_sizes=(1, 2, 4, 8))
    monkeypatch.setattr(Dominated, "beyond", lambda self, key, batch: None)  # every setting to the end
    full = run_config(spec, variants, cp_sizes=(1, 2, 4, 8))
    assert any(r["dominated"] for r in pruned) and not any(r["dominated"] for r in full)
    for p, f in zip(pruned, full):
        assert {k: v for k, v in p.items() if k not in SKIP} == {k: v for k, v in f.items() if k not in SKIP}
        for s in p["dominated"]:  # stopped where the full run was slower than the deployed setting
            assert p["tried"][s] is None and (f["tried"][s] is None or f["tried"][s] > f["iteration_s"]), (p["variant"], s)
        assert all(p["tried"][s] == f["tried"][s] for s in p["tried"] if s not in p["dominated"])
    # Megatron refuses hybrid CP with pipeline stages: dynamic_cp's simulated time is kept apart there
    dc = next(r for r in full if r["variant"] == "dynamic_cp")
    assert ("iteration_s" in dc) == (stages == 1) and ("hypothetical_iteration_s" in dc) == (stages > 1)
    assert (dc["error"].startswith("not deployable with pipeline stages")) == (stages > 1), dc["error"]
