"""Runs of batches with baselines as deployed, activation recompute, memory balance, and Zeppelin
weighing the baselines' shapes (issue 14)."""

import dataclasses
import os
import subprocess
import sys

import pytest

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.memory import RECOMPUTE_LADDER, activation_bytes, capacity_tokens, plan_memory_balance
from megatron_zeppelin.spec.recompute import Recompute
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner import make_context, plan_batch
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.sim.matrix import batch_and_recompute, load_matrix
from megatron_zeppelin.sim.runs import domain_topology, make_plan, run_settings


def _setup(nodes=2, cluster="a800", model="llama-7b", capacity=0):
    profile, spec = load_profile(cluster), load_model(model)
    topo = domain_topology(profile, nodes)
    cfg = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                         gpu_nic_map=topo.gpu_to_nic, capacity_tokens=capacity)
    return profile, spec, topo, cfg


def test_recompute_capacities_follow_megatrons_modules():
    m = load_model("llama-7b")
    caps = [capacity_tokens(m, 80e9, dp=32, recompute=rc) for rc in RECOMPUTE_LADDER]
    assert caps == sorted(caps) and caps[0] < 5000 and caps[1] < caps[0] * 1.1  # core_attn saves little
    assert 8000 < caps[2] < 9500 and 10000 < caps[3] < 11000 and 33000 < caps[4] < 35000
    assert Recompute.parse("selective") == Recompute("selective", ("core_attn",))  # Megatron's default module
    assert activation_bytes(m, 1000, 0) < activation_bytes(m, 0, 1000)  # the MLP side saves more per token


def test_the_matrix_takes_the_fastest_recompute_that_fits():
    tok, cap, rc = batch_and_recompute("a800", "llama-7b", 1, 4, "8K")
    assert rc == "selective:core_attn,mlp,layernorm" and tok <= 0.8 * cap  # +mlp holds 8.8K: not 8K at 0.8
    assert batch_and_recompute("h200", "llama-3b", 1, 4, "4K")[2] == "none"
    with pytest.raises(Exception, match="even with full recompute"):
        batch_and_recompute("a800", "llama-7b", 1, 4, "64K")


def test_recompute_repeats_ring_communication_only_for_split_documents():
    """The recomputed forward is in each layer's backward (predict and simulator: test_one_cost_model);
    here on the 7B/A800 case: a local document repeats only its attention compute, a ring-split one
    also waits on its ring again, full recompute adds more than core_attn on every rank."""
    profile, spec, topo, cfg = _setup()
    ring = plan_batch([65536], topo, profile, spec, cfg, strategy="static_cp")
    assert ring.rings and max(c.comm_exposed_s for c in ring.cost) > 0
    local = plan_batch([4096] * 16, topo, profile, spec, cfg, strategy="packed_dp")
    ctx = make_context(topo, profile, spec, cfg, 65536)
    for plan in (ring, local):
        core, full = (make_plan(plan.strategy, list(plan.lengths), topo, profile, spec, cfg.with_(recompute=rc),
                                plan.meta and dict(plan.meta).get("cp_size") or None)
                      for rc in ("selective:core_attn", "full"))
        assert dict(core.meta)["recompute"] == "selective:core_attn"
        assert all(f.total_s >= c.total_s >= b.total_s for f, c, b in zip(full.cost, core.cost, plan.cost))
        assert full.predicted_iteration_s > core.predicted_iteration_s > plan.predicted_iteration_s
        assert plan.lower_bound_s < core.lower_bound_s <= core.predicted_iteration_s
    core_local = plan_batch(list(local.lengths), topo, profile, spec, cfg.with_(recompute="selective:core_attn"),
                            strategy="packed_dp")
    for r in range(topo.world_size):  # local: exactly the attention forward again, no communication
        docs = local.local_docs(r)  # and their kernel call (one per rank and layer)
        fwd = spec.layers * (sum(float(ctx.cost.block_pass_s(d.length, d.length, True)) for d in docs)
                             + ctx.cost.call_s() * bool(docs))
        assert core_local.cost[r].total_s - local.cost[r].total_s == pytest.approx(fwd)


def test_memory_balance_of_a_plan():
    profile, spec, topo, cfg = _setup()
    plan = plan_batch([30000, 2000, 1000] + [500] * 20, topo, profile, spec, cfg, strategy="zeppelin")
    mem = plan_memory_balance(plan, spec, 1, "full")
    assert len(mem["bytes"]) == topo.world_size and mem["imbalance"] >= 1.0
    assert mem["max_bytes"] == max(mem["bytes"])


def test_zeppelin_routes_a_single_64k_document_over_both_nodes():
    # Before: an 8-rank ring inside one node (static_cp CP 8's plan, 4.06 s predicted) while routed
    # CP 16 over both nodes predicts 2.35 s. Zeppelin now weighs the baselines' shapes.
    profile, spec, topo, cfg = _setup()
    z = plan_batch([65536], topo, profile, spec, cfg, strategy="zeppelin")
    routed = make_plan("static_cp+routing", [65536], topo, profile, spec, cfg, 16)
    assert z.predicted_iteration_s <= routed.predicted_iteration_s * (1 + 1e-9)
    assert [r.size for r in z.rings] == [16]


@pytest.mark.parametrize("lengths,nodes", [([65536], 2), ([3000, 1500], 1), ([9000, 7000, 300], 1),
                                           ([40000, 20000, 9000, 100], 2)])
def test_zeppelin_never_predicts_slower_than_a_baseline(lengths, nodes):
    profile, spec, topo, cfg = _setup(nodes)
    if nodes == 1:  # small batches: 4 ranks
        from megatron_zeppelin.spec.topology import Topology
        topo = Topology(1, 4, 4)
        cfg = cfg.with_(gpus_per_node=4, nics_per_node=4, gpu_nic_map=())
    z = plan_batch(lengths, topo, profile, spec, cfg, strategy="zeppelin").predicted_iteration_s
    cap = 2 * -(-sum(lengths) // topo.world_size)
    for v in ("packed_dp", "static_cp", "static_cp+routing", "hybrid_dp", "dynamic_cp"):
        for s in run_settings(v, topo.world_size, cap, max(lengths), ()):
            try:
                b = make_plan(v, lengths, topo, profile, spec, cfg, s).predicted_iteration_s
            except Exception:
                continue  # the setting does not fit this batch
            assert z <= b * (1 + 1e-9), (v, s, z, b)


def test_bench_studies_work_outside_the_project_root(tmp_path):
    items, _ = load_matrix(None)
    assert {"smoke", "main", "memory"} <= {spec.study for spec, _, _ in items}
    smoke = [spec for spec, _, _ in items if spec.study == "smoke"]
    assert {spec.regime for spec in smoke} == {"memory", "fixed"} and all(spec.batches == 4 for spec in smoke)
    code = "from megatron_zeppelin.sim.matrix import load_matrix; print(len(load_matrix('megatron_zeppelin/presets/runs/paper.yaml')[0]))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0 and int(out.stdout) == len(items), out.stderr


def test_dynamic_cp_rounds_run_one_after_another():
    from megatron_zeppelin.planner.baselines.dynamic_cp import dynamic_cp_rounds
    from megatron_zeppelin.sim.runs import simulate_rounds
    profile, spec, topo, cfg = _setup(1)
    lengths = [30000, 20000, 9000, 8000, 3000, 2000, 1500, 1000, 700, 500]
    ctx = make_context(topo, profile, spec, cfg, sum(lengths))
    mslpr = 4096
    rounds = dynamic_cp_rounds(lengths, ctx, mslpr)
    assert len(rounds) > 1 and sorted(i for r in rounds for i in r) == list(range(len(lengths)))
    merged, res = simulate_rounds(lengths, topo, profile, spec, cfg, mslpr, 1)
    assert len(res.plans) == len(rounds)
    assert res.iteration_s == pytest.approx(sum(r.iteration_s for r in res.results))
    assert [r.allreduce_exposed_s > 0 for r in res.results] == [False] * (len(rounds) - 1) + [True]


def test_zeppelin_weighs_hybrid_dp_on_batches_of_many_documents_per_rank():
    # The main study's 30B github batches on 8 ranks (tp 4) hold 7-10 documents per rank, above
    # SMALL_BATCH: hybrid_dp's shape was no candidate then, and its own plan was predicted up to 12%
    # faster than Zeppelin's (3 of 36 configurations lost, by 0.2-1.8% simulated).
    from megatron_zeppelin.planner.portfolio.shapes import HYBRID_DOCS, SMALL_BATCH
    from megatron_zeppelin.sim.runs import run_lengths
    spec = next(s for s, _, _ in load_matrix(None)[0] if s.study == "main" and s.cluster == "h800"
                and s.model == "llama-30b" and s.dataset == "github")
    profile, model = load_profile(spec.cluster), load_model(spec.model)
    topo = domain_topology(profile, spec.nodes, spec.tp)
    cfg = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                         gpu_nic_map=topo.gpu_to_nic, cluster=spec.cluster, tp=spec.tp, recompute=spec.recompute)
    lengths = run_lengths(dataclasses.replace(spec, batches=16), topo.world_size)[12]  # batch 12 of a 16-batch run
    assert SMALL_BATCH * topo.world_size < len(lengths) <= HYBRID_DOCS
    z = plan_batch(lengths, topo, profile, model, cfg, strategy="zeppelin").predicted_iteration_s
    h = plan_batch(lengths, topo, profile, model, cfg, strategy="hybrid_dp").predicted_iteration_s
    assert z <= h * (1 + 1e-9)


def _acc_spec(**kw):
    from megatron_zeppelin.sim.runs import RunSpec
    base = dict(study="t", cluster="a800", model="tiny", tp=1, dataset="github", context=4096, nodes=1,
                tokens_per_gpu=1024, batches=2)
    return RunSpec(**{**base, **kw})


def test_gradient_accumulation_sums_the_micro_batches_then_reduces_once():
    """Micro-batch k of batch b is sampled with seed b x M + k: the run of one micro-batch per batch
    and M x B batches holds the same micro-batches in order, so each accumulated iteration is the sum
    of M of its iterations less their gradient reduce, plus one reduce (every setting tried)."""
    from megatron_zeppelin.sim.runs import DATA_ORDER, run_config
    from megatron_zeppelin.sim.matrix import micro_batches
    m = micro_batches(2 * 1024 * 8, 1024, 8)
    assert m == 2
    variants = (DATA_ORDER, "packed_dp", "static_cp", "dynamic_cp")  # Zeppelin's micro-batches as sampled
    acc = run_config(_acc_spec(global_batch_tokens=2 * 1024 * 8, micro_batches=m), variants, cp_sizes=(1, 2, 4))
    one = run_config(_acc_spec(batches=4), variants, cp_sizes=(1, 2, 4))
    for a, o in zip(acc, one):
        assert a["variant"] == o["variant"] and not a["error"] and a["key"] != o["key"]
        ar = o["allreduce_s"]
        assert ar > 0 and a["allreduce_s"] == pytest.approx(ar)
        assert a["tokens"] == pytest.approx(2 * o["tokens"]) and a["documents"] == pytest.approx(2 * o["documents"])
        if a["variant"] == "dynamic_cp":  # Megatron's scheduler packs the whole global batch (sim/runs.py)
            continue
        if a["run_setting_name"]:  # per run-level setting: the mean over the run
            assert a["tried"].keys() == o["tried"].keys()
            for s, t in a["tried"].items():
                if t is not None and o["tried"][s] is not None:
                    assert t == pytest.approx(m * (o["tried"][s] - ar) + ar, rel=1e-9), (a["variant"], s)
        else:
            ts = o["batch_iteration_s"]
            want = [sum(ts[b * m:(b + 1) * m]) - (m - 1) * ar for b in range(2)]
            assert a["batch_iteration_s"] == pytest.approx(want, rel=1e-9)
            # a rank holds one micro-batch at a time: the peak is the largest micro-batch's, not the sum
            assert a["peak_activation_GB"] < 2 * o["peak_activation_GB"]


def test_each_strategy_deploys_the_fastest_recompute_its_own_plans_fit():
    """A memory-bound run (7B, 16 H200s): packed_dp cannot hold a 64K document on one rank without
    recompute and climbs the ladder; Zeppelin fits without any. A setting stops climbing at its first
    rung that fits every batch, but for a plan that reads the capacity (Zeppelin's): it also tries the
    rung the fastest fixed-shape variant, packed_dp, deployed (run first, whatever the order asked),
    and keeps the faster."""
    from megatron_zeppelin.sim.matrix import memory_tokens
    from megatron_zeppelin.sim.runs import recompute_rungs, run_config
    tok, cap = memory_tokens("h200", "llama-7b", 1, 2)
    spec = _acc_spec(cluster="h200", model="llama-7b", dataset="prolong64k", context=65536, nodes=2, tokens_per_gpu=tok,
                     capacity=cap, batches=1, regime="memory", recompute_per_strategy=True)
    rungs = recompute_rungs(spec)
    assert [rc for rc, _ in rungs] == list(RECOMPUTE_LADDER) and rungs[0][1] == cap
    z, p = run_config(spec, ("zeppelin", "packed_dp"))
    assert (z["variant"], p["variant"]) == ("zeppelin", "packed_dp")
    assert list(z["tried"]) == ["auto rc=none", f"auto rc={p['recompute']}"]
    assert z["recompute"] == "none" and z["capacity"] == cap and z["tried"]["auto rc=none"] == z["iteration_s"]
    assert p["recompute"] != "none" and p["capacity"] == dict(rungs)[p["recompute"]]
    assert list(p["tried"].values())[-1] == p["iteration_s"] and all(t is None for t in list(p["tried"].values())[:-1])
    assert p["recompute_s"] > 0 and z["recompute_s"] == 0
    assert z["iteration_s"] < p["iteration_s"]
    # one lower bound for the configuration, at the fastest rung (none), whichever rung a record deployed:
    # packed_dp's own plans bound at its recompute would pay the recomputed forward too
    assert z["lower_bound_s"] == pytest.approx(p["lower_bound_s"], rel=1e-9)
    assert z["lower_bound_s"] < z["iteration_s"] < p["iteration_s"]


def test_static_cp_comm_type_is_fixed_for_the_run():
    """TE's cp_comm_type is a run-level flag like the CP size: each setting plans one kind of ring
    (a bare size p2p, "a2a:N" a2a), never the faster of the two per batch."""
    from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE
    from megatron_zeppelin.spec.config import ZeppelinConfig
    from megatron_zeppelin.spec.topology import Topology
    ok = lambda cp: TOY_MODEL.kv_heads % cp == 0  # noqa: E731 -- 2 K/V heads
    assert run_settings("static_cp", 4, 1000, 100, (), ok) == [1, 2, 4, "a2a:2"]
    assert run_settings("allgather_cp", 4, 1000, 100, (), ok) == [1, 2, 4]
    topo, lengths = Topology(1, 4), [900, 300, 200, 100, 60, 40]
    cfg = ZeppelinConfig(gpus_per_node=4)
    for setting, comm in ((2, "p2p"), ("a2a:2", "a2a")):
        plan = make_plan("static_cp", lengths, topo, TOY_PROFILE, TOY_MODEL, cfg, setting)
        assert plan.rings and {r.comm for r in plan.rings} == {comm} and {r.size for r in plan.rings} == {2}
