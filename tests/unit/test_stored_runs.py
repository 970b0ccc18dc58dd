"""sim/stored.py: a study file's records read back as the RunSpecs that made them."""

import dataclasses
import json

import pytest

from megatron_zeppelin.sim.runs import RunSpec
from megatron_zeppelin.sim.stored import stored_runs


def test_a_stored_record_gives_back_its_spec(tmp_path):
    a = RunSpec("accumulation", "a800", "llama-7b", 1, "prolong64k", 65536, 4, 4561, regime="memory",
                global_batch_tokens=1 << 20, micro_batches=9)
    b = dataclasses.replace(a, dataset="github")
    runs = [dict(dataclasses.asdict(s), variant=v, label=s.label(), iteration_s=1.0)
            for s in (a, b) for v in ("zeppelin", "dynamic_cp")]
    path = tmp_path / "study.json"
    path.write_text(json.dumps({"runs": runs}))
    assert [s for s, _ in stored_runs(str(path))] == [a, b]
    assert [s for s, _ in stored_runs(str(path), label=b.label())] == [b]
    (spec, rec), = stored_runs(str(path), "dynamic_cp", dataset="prolong64k")
    assert spec == a and rec["variant"] == "dynamic_cp"
    with pytest.raises(SystemExit, match="no zeppelin run with dataset='arxiv'"):
        stored_runs(str(path), dataset="arxiv")


def test_a_stored_run_is_set_up_at_its_deployed_recompute():
    from megatron_zeppelin.sim.runs import recompute_rungs
    from megatron_zeppelin.sim.stored import recorded_setup
    spec = RunSpec("accumulation", "a800", "llama-7b", 1, "prolong64k", 65536, 4, 4561, regime="memory",
                   global_batch_tokens=1 << 20, micro_batches=9, recompute_per_strategy=True)
    rungs = dict(recompute_rungs(spec))
    rc = sorted(rungs)[-1]
    profile, model, topo, config = recorded_setup(spec, {"recompute": rc})
    assert (profile.name, model.name, topo.world_size) == ("a800", "llama-7b", 32)
    assert config.capacity_tokens == rungs[rc] and config.recompute.describe() == rc
