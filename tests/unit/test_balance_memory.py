"""--zeppelin-balance-memory (planner/memory_choice.plan_memory_first): Zeppelin planned with every
rank's layouts within 1.10x the batch's mean tokens, so per-rank peak activation memory is within
1.10x the mean; the uncapped plan where nothing fits under the cap; the flag from Megatron's
arguments, `zeppelin plan` and the matrix (a study of its own, outside the overall summary)."""

import argparse

import pytest

from megatron_zeppelin.commands.report import _doc
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.memory import plan_memory_balance
from megatron_zeppelin.integration.args import add_zeppelin_args, config_from_args
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner import Planner
from megatron_zeppelin.planner.portfolio import memory as memory_choice
from megatron_zeppelin.planner.build.assemble import MEMORY_BALANCE
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.sim.matrix import batch_and_recompute, load_matrix
from megatron_zeppelin.sim.runs import RunSpec, domain_topology, run_lengths


def _run(batches=2):
    """The first batches of a main-study run whose fastest plans leave memory imbalanced (a800,
    llama-7b, prolong64k at 64K, 4 nodes, 16K tokens per GPU, full recompute)."""
    per, cap, rc = batch_and_recompute("a800", "llama-7b", 1, 4, 16384, "auto")
    profile, model = load_profile("a800"), load_model("llama-7b")
    topo = domain_topology(profile, 4)
    spec = RunSpec("t", "a800", "llama-7b", 1, "prolong64k", 65536, 4, per, capacity=cap, batches=batches,
                   recompute=rc)
    config = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                            gpu_nic_map=topo.gpu_to_nic, cluster="a800", recompute=rc, capacity_tokens=cap)
    return topo, profile, model, config, run_lengths(spec, topo.world_size)


def test_balanced_memory_within_the_goal_where_the_fastest_plan_is_not():
    topo, profile, model, config, batches = _run()
    fast = Planner(topo, profile, model, config)
    balanced = Planner(topo, profile, model, config.with_(balance_memory=True))
    for lengths in batches:
        p, q = fast.plan(lengths), balanced.plan(lengths)
        assert plan_memory_balance(p, model, 1, config.recompute)["imbalance"] > 1.5  # the default's
        assert plan_memory_balance(q, model, 1, config.recompute)["imbalance"] <= MEMORY_BALANCE
        cap = int(MEMORY_BALANCE * sum(lengths) / topo.world_size)
        assert q.meta.token_cap == cap and p.meta.token_cap is None
        assert max(max(q.tokens(r), q.tokens(r, "linear")) for r in range(q.world_size)) <= cap
        assert q.predicted_iteration_s >= p.predicted_iteration_s * 0.95  # a price, not a free lunch here


def test_baselines_ignore_the_flag():
    topo, profile, model, config, batches = _run(1)
    a = Planner(topo, profile, model, config).plan(batches[0], "static_cp")
    b = Planner(topo, profile, model, config.with_(balance_memory=True)).plan(batches[0], "static_cp")
    assert a == b


def test_without_a_placement_under_the_cap_the_plan_is_the_uncapped_one(monkeypatch):
    topo, profile, model, config, batches = _run(1)
    want = Planner(topo, profile, model, config).plan(batches[0])
    monkeypatch.setattr(memory_choice, "memory_cap", lambda lengths, ctx: 1)  # no document fits one token
    got = Planner(topo, profile, model, config.with_(balance_memory=True)).plan(batches[0])
    assert got == want and got.meta.token_cap is None


def test_the_flag_reaches_the_config_from_megatron_and_zeppelin_plan():
    p = add_zeppelin_args(argparse.ArgumentParser())
    assert config_from_args(p.parse_args(["--zeppelin-balance-memory"])).balance_memory
    assert not config_from_args(p.parse_args([])).balance_memory
    from megatron_zeppelin.cli import build_parser
    args = build_parser().parse_args(["plan", "--zeppelin-balance-memory"])
    assert args.balance_memory


def test_the_matrix_study_plans_zeppelin_balanced_and_stays_out_of_the_overall_summary():
    items, _ = load_matrix(None)
    bm = [s for s, _, _ in items if s.study == "balance_memory"]
    assert bm and all(s.balance_memory for s in bm) and {s.regime for s in bm} == {"memory", "fixed"}
    assert not any(s.balance_memory for s, _, _ in items if s.study != "balance_memory")
    assert bm[0].key() != RunSpec(**{**bm[0].__dict__, "balance_memory": False}).key()

    def rec(study, variant, t, balanced):
        return {"study": study, "key": study + "/k", "variant": variant, "iteration_s": t, "lower_bound_s": 1.0,
                "regime": "fixed", "balance_memory": balanced, "error": ""}
    records = [rec("main", "zeppelin", 1.0, False), rec("main", "static_cp", 1.5, False),
               rec("balance_memory", "zeppelin", 1.2, True), rec("balance_memory", "static_cp", 1.0, True)]
    doc = _doc("m.yaml", records)
    assert doc["summary"]["static_cp"]["deployed"]["mean_speedup"] == pytest.approx(1.5)  # main only
    assert doc["studies"]["balance_memory"]["summary"]["static_cp"]["deployed"]["losses"] == ["balance_memory/k"]


def test_the_report_pairs_the_study_with_the_default_zeppelin_of_the_same_configurations():
    from megatron_zeppelin.reports.matrix import _against_default
    base = {"cluster": "a800", "model": "llama-7b", "tp": 1, "dataset": "arxiv", "context": 65536, "nodes": 4,
            "tokens_per_gpu": 16384, "capacity": 34000, "recompute": "full", "seed": 0, "batches": 16,
            "variant": "zeppelin", "error": ""}
    runs = [dict(base, study="main", iteration_s=2.0, memory_imbalance=1.6),
            dict(base, study="balance_memory", balance_memory=True, iteration_s=2.1, memory_imbalance=1.09),
            dict(base, study="balance_memory", balance_memory=True, dataset="github", iteration_s=9.0,
                 memory_imbalance=1.0)]  # no default run of it: not paired
    line = _against_default(runs, "balance_memory")[-1]
    assert "same 1 configurations" in line and "x1.0500" in line and "1.600 -> 1.090" in line
    assert _against_default(runs, "main") == []
