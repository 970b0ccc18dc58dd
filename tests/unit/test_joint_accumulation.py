"""Joint assignment of a global batch's documents to its micro-batches (planner/accumulation.py,
--zeppelin-accumulation) and pipeline stages in the iteration model (planner/iteration.py
one_f_one_b, sim/iteration.py pipeline; issues 49 and 52)."""

import argparse
import itertools

import pytest

from megatron_zeppelin.planner.accumulation import (assign_micro_batches, document_s, joint_indices, joint_steps,
                                                    length_indices, plan_iteration, round_indices)
from megatron_zeppelin.planner.iteration import Iteration, one_f_one_b, pipeline_s
from megatron_zeppelin.planner.testing import toy_context
from megatron_zeppelin.spec.config import ConfigError, ZeppelinConfig
from megatron_zeppelin.spec.words import Accumulation

STEPS = [[30000, 20000, 9000, 700], [4000] * 10 + [500] * 4, [12000, 8000, 3000, 3000, 3000, 1000, 1000, 1000, 1000, 500],
         [2000] * 15]


def _spread(steps, cost):
    loads = [sum(document_s(cost, L) for L in s) for s in steps]
    return max(loads) / (sum(loads) / len(loads))


def test_joint_assignment_keeps_every_document_within_the_room_and_balances_the_micro_batches():
    cost = toy_context(gpus=4).cost
    room = max(sum(s) for s in STEPS)
    joint = assign_micro_batches(STEPS, cost, room)
    assert sorted(itertools.chain(*joint)) == sorted(itertools.chain(*STEPS)) and len(joint) == len(STEPS)
    assert all(sum(s) <= room for s in joint)
    assert _spread(joint, cost) < 0.7 * _spread(STEPS, cost)  # the data order holds both long ones in one
    loads = [sum(document_s(cost, L) for L in s) for s in joint]  # LPT: within one document of the mean
    assert max(loads) <= sum(loads) / len(loads) + max(document_s(cost, L) for L in itertools.chain(*STEPS))
    assert assign_micro_batches(STEPS, cost, room) == joint  # deterministic
    flipped = assign_micro_batches([list(reversed(s)) for s in STEPS], cost, room)  # each keeps data order
    assert [sorted(s) for s in flipped] == [sorted(s) for s in joint]


def test_a_document_without_room_goes_where_most_room_is_left_within_the_hard_limit():
    cost = toy_context(gpus=4).cost
    assert assign_micro_batches([[900, 900], [900]], cost, room=1000) == [[900, 900], [900]]
    with pytest.raises(ValueError, match="fits no micro-batch"):
        assign_micro_batches([[900, 900], [900]], cost, room=1000, hard_room=1500)


def test_by_length_puts_like_documents_together_longest_first_and_fills_every_micro_batch():
    docs = [L for s in STEPS for L in s]
    room = max(sum(s) for s in STEPS)
    idx = length_indices(STEPS, room)
    got = [[docs[i] for i in m] for m in idx]
    assert sorted(i for m in idx for i in m) == list(range(len(docs))) and all(m == sorted(m) for m in idx)
    assert all(sum(s) <= room for s in got)
    assert got[0][:2] == [30000, 20000] and max(got[-1]) <= 2000  # the long ones first, the short ones last
    assert length_indices(STEPS, room) == idx  # deterministic
    # more micro-batches than the documents fill: each still trains one (the fullest gives its shortest)
    assert length_indices([[5, 5], [5], [1]], room=100) == [[0, 1], [3], [2]]  # all fit the first: 1, then 5
    assert length_indices([[50, 40], [1]], room=100) == [[0, 1], [2]]
    with pytest.raises(ValueError, match="fits no micro-batch"):
        length_indices([[900, 900], [900]], room=1000, hard_room=1500)


def test_by_length_beats_data_order_on_a_memory_bound_accumulation_iteration():
    """The a800 llama-7b github 1M-token iteration of the accumulation study (9 micro-batches at 80% of
    memory): its micro-batches in data order mix one long document with short ones, which cannot balance
    within the capacity; grouped by length they can (simulated, sim/runs.py; 8.15 s -> 7.49 s when
    measured; dynamic_cp 7.28 s)."""
    from megatron_zeppelin.sim.runs import BY_LENGTH, DATA_ORDER, JOINT, run_config
    from megatron_zeppelin.sim.matrix import load_matrix
    spec = next(s for s, _, _ in load_matrix(None)[0]
                if s.key().startswith("accumulation/a800/llama-7b-tp1/github/"))
    spec = type(spec)(**{**spec.__dict__, "batches": 1})
    t = {r["variant"]: r["iteration_s"] for r in run_config(spec, [DATA_ORDER, BY_LENGTH, JOINT])}
    assert t[BY_LENGTH] < 0.95 * t[DATA_ORDER] and t[BY_LENGTH] < t[JOINT]


def test_rounds_packs_as_megatrons_scheduler_and_keeps_megatrons_count_of_micro_batches():
    from megatron_zeppelin.planner.baselines.dynamic_cp import dynamic_cp_rounds
    ctx = toy_context(gpus=4, capacity=16000)
    docs = [L for s in STEPS for L in s]
    rounds = [sorted(r) for r in dynamic_cp_rounds(docs, ctx, 16000, pad=False)]
    assert len(rounds) < len(STEPS)  # fuller than the data order's, so fewer
    # without pipeline stages: the scheduler's rounds as it packed them (the other steps run empty)
    assert round_indices(STEPS, ctx.cost, 16000) == rounds
    # with them every one of Megatron's k forward steps trains something: short documents split off
    idx = round_indices(STEPS, ctx.cost, 16000, every_step=True)
    assert sorted(i for m in idx for i in m) == list(range(len(docs))) and all(m == sorted(m) for m in idx)
    assert len(idx) == len(STEPS) and all(idx)
    assert all(set(m) <= set(r) for m, r in zip(idx, rounds))  # each round as the scheduler packed it, less
    assert all(len(m) == 1 for m in idx[len(rounds):])  # ... the short documents given to the extra ones
    assert round_indices(STEPS, ctx.cost, 16000, every_step=True) == idx  # deterministic
    assert joint_indices(STEPS, ctx.cost, 16000, 4, Accumulation.ROUNDS, (16000, 16000), stages=2) == idx
    # more rounds than micro-batches: on 2 ranks of 100 tokens no two of 70, 70 and 60 share a rank
    # within max_seqlen_per_dp_cp_rank, so three rounds for Megatron's two full micro-batches: by_length's
    tight, full = toy_context(gpus=2, capacity=100), [[70, 70, 60], [70, 70, 60]]
    assert round_indices(full, tight.cost, 100) is None
    assert (joint_indices(full, tight.cost, 100, 2, Accumulation.ROUNDS)
            == joint_indices(full, tight.cost, 100, 2, Accumulation.BY_LENGTH))


def test_rounds_fill_climbs_from_data_orders_share_only_as_far_as_k_rounds_need():
    """Rounds start at the largest data-order micro-batch's per-rank share, where the scheduler's
    packing may need one round more than the k micro-batches, and climb by 1/FILL_STEPS of it to the
    least fill that fits: never to the capacity when less does."""
    from megatron_zeppelin.planner.accumulation import round_fill
    steps = [[3000, 900, 100], [2500, 1500], [1200, 1200, 1200, 400], [2000, 1000, 700, 300]]  # 4000 each
    ctx = toy_context(gpus=4, capacity=2000)
    docs = [L for s in steps for L in s]
    assert round_fill(steps, 4, capacity=2000) == (1000, 2000)
    assert joint_indices(steps, ctx.cost, 2000, 4, Accumulation.ROUNDS) == round_indices(steps, ctx.cost, 1000, 2000)

    def rounds(*fill):
        return [sorted((docs[i] for i in m), reverse=True) for m in round_indices(steps, ctx.cost, *fill)]

    # at 1000 a rank the scheduler needs 5 rounds; at 1125 four, each within 4 x 1125 tokens
    assert rounds(1000, 2000) == [[3000, 1500], [2500, 2000], [1200, 1200, 1000, 900, 100], [1200, 700, 400, 300]]
    assert round_indices(steps, ctx.cost, 1000) is None  # no room above the fill: no climb
    # filled to the capacity: three rounds, 8000, 7900 and 900 tokens (the fourth micro-batch empty)
    assert rounds(2000) == [[3000, 2500, 1500, 1000], [2000, 1200, 1200, 1200, 700, 400, 300, 100], [900]]


def test_rounds_beats_by_length_and_data_order_on_a_memory_bound_accumulation_iteration():
    """The iteration of the by_length test: by_length's first micro-batch holds the five longest
    documents, which cannot balance within the capacity; the scheduler's rounds put a long document
    beside the shorter ones that fill its ranks (simulated: 8.15 s data order, 7.49 s by length,
    7.18 s rounds when measured; dynamic_cp 7.28 s). Rounds is the default: ``zeppelin`` runs it,
    the same plans as ``zeppelin+rounds``."""
    from megatron_zeppelin.sim.runs import BY_LENGTH, DATA_ORDER, ROUNDS, run_config
    from megatron_zeppelin.sim.matrix import load_matrix
    spec = next(s for s, _, _ in load_matrix(None)[0]
                if s.key().startswith("accumulation/a800/llama-7b-tp1/github/"))
    spec = type(spec)(**{**spec.__dict__, "batches": 1})
    t = {r["variant"]: r["iteration_s"] for r in run_config(spec, ["zeppelin", DATA_ORDER, BY_LENGTH, ROUNDS])}
    assert t[ROUNDS] < t[BY_LENGTH] < t[DATA_ORDER]
    assert t["zeppelin"] == t[ROUNDS]


def test_joint_iteration_plans_the_same_documents_and_data_order_is_unchanged():
    ctx = toy_context(gpus=4)
    topo, prof, model = ctx.topology, ctx.profile, ctx.model
    from megatron_zeppelin.planner import plan_batch
    cfg = ZeppelinConfig(gpus_per_node=4, accumulation="data_order")
    data = plan_iteration(STEPS, topo, prof, model, cfg)
    assert [p.digest() for p in data.steps] == [plan_batch(s, topo, prof, model, cfg).digest() for s in STEPS]
    jcfg = cfg.with_(accumulation="joint")
    joint = plan_iteration(STEPS, topo, prof, model, jcfg)
    assert sorted(itertools.chain(*(p.lengths for p in joint.steps))) == sorted(itertools.chain(*STEPS))
    lists, planned = joint_steps(STEPS, topo, prof, model, jcfg)
    assert [list(p.lengths) for p in joint.steps] == lists
    assert planned.capacity_tokens == 2 * -(-max(sum(s) for s in STEPS) // 4)  # the largest data-order step's
    # a baseline keeps its own (data) order
    assert ([p.digest() for p in plan_iteration(STEPS, topo, prof, model, jcfg, strategy="packed_dp").steps]
            == [p.digest() for p in plan_iteration(STEPS, topo, prof, model, cfg, strategy="packed_dp").steps])


def test_the_flag_is_typed_and_read_by_the_training_flags():
    assert ZeppelinConfig().accumulation is Accumulation.ROUNDS  # the default
    assert ZeppelinConfig(accumulation="joint").accumulation is Accumulation.JOINT
    assert ZeppelinConfig(accumulation="by_length").accumulation is Accumulation.BY_LENGTH
    assert ZeppelinConfig(accumulation="rounds").accumulation is Accumulation.ROUNDS
    with pytest.raises(ConfigError, match="--zeppelin-accumulation"):
        ZeppelinConfig(accumulation="sorted")
    from megatron_zeppelin.integration.args import add_zeppelin_args, config_from_args
    a = add_zeppelin_args(argparse.ArgumentParser()).parse_args(["--zeppelin-accumulation", "joint"])
    assert config_from_args(a).accumulation is Accumulation.JOINT  # plan / simulate read it
    a.zeppelin_balance = True  # the Megatron-LM entry trains it (integration/megatron_lm.py)
    assert config_from_args(a).accumulation is Accumulation.JOINT


@pytest.mark.parametrize("p,m", [(1, 1), (2, 2), (2, 5), (4, 4), (4, 9), (8, 3), (8, 16)])
def test_1f1b_of_equal_micro_batches_is_m_plus_p_minus_1_stage_steps(p, m):
    f, b = 0.5, 1.25
    assert one_f_one_b([[f] * m] * p, [[b] * m] * p) == pytest.approx((m + p - 1) * (f + b))
    assert pipeline_s([3.0] * m, p) == pytest.approx((m + p - 1) * 3.0 / p)


def test_1f1b_charges_uneven_micro_batches_and_never_beats_the_busiest_stage():
    even = pipeline_s([2.0] * 8, 4)
    uneven = pipeline_s([5.0, 1.0, 1.0, 1.0, 1.0, 5.0, 1.0, 1.0], 4)  # the same 16 s of work
    assert uneven > even
    for p in (2, 4):
        fwd = [[0.3, 1.1, 0.2, 0.9, 0.4]] * p
        bwd = [[0.6, 2.2, 0.4, 1.8, 0.8]] * p
        total = one_f_one_b(fwd, bwd)
        assert total >= sum(fwd[0]) + sum(bwd[0])  # a stage runs all its work
        assert total < p * (sum(fwd[0]) + sum(bwd[0]))  # the stages overlap


def test_iteration_with_stages_reads_the_1f1b_formula():
    from megatron_zeppelin.planner import plan_batch
    ctx = toy_context(gpus=4)
    plans = tuple(plan_batch(s, ctx.topology, ctx.profile, ctx.model, ZeppelinConfig(gpus_per_node=4)) for s in STEPS)
    flat, piped = Iteration(plans), Iteration(plans, stages=2)
    steps = [p.predicted_iteration_s for p in plans]
    assert flat.predicted_iteration_s == pytest.approx(sum(steps) + plans[0].allreduce_s)
    assert piped.predicted_iteration_s == pytest.approx(pipeline_s(steps, 2) + plans[0].allreduce_s / 2)
    assert piped.pipeline_s > sum(steps) / 2  # the bubble


def test_simulated_pipeline_of_one_stage_is_the_accumulated_iteration():
    from megatron_zeppelin.sim.iteration import SimResult, accumulate, pipeline

    def res(f, b):
        return SimResult(f + b + 0.5 + 0.2, f, 0.5, b, 0.2, 0.2, 4, "scale", [{"attention": f + b}],
                         [{"nic": 0, "bytes_out": 1.0, "bytes_in": 1.0, "util_out": 0.1, "util_in": 0.1}], {"nic": 1.0})
    steps = [res(1.0, 2.0), res(3.0, 6.0), res(0.5, 1.0)]
    assert pipeline(steps, 1).iteration_s == accumulate(steps).iteration_s
    two = pipeline(steps, 2)
    assert two.allreduce_exposed_s == pytest.approx(0.1) and two.rank_compute_s == accumulate(steps).rank_compute_s
    fwd = [[1.0 / 2, 3.0 / 2, 0.5 / 2], [1.0 / 2 + 0.5, 3.0 / 2 + 0.5, 0.5 / 2 + 0.5]]
    bwd = [[1.0, 3.0, 0.5]] * 2
    assert two.iteration_s == pytest.approx(one_f_one_b(fwd, bwd) + 0.1)


def test_matrix_pipeline_splits_the_nodes(tmp_path):
    from megatron_zeppelin.sim.matrix import MatrixError, load_matrix
    m = tmp_path / "m.yaml"
    m.write_text("studies:\n  s:\n    clusters: [h200]\n    models: [{name: llama3-70b, tp: 8}]\n"
                 "    datasets: [prolong64k]\n    context: [64K]\n    nodes: [8]\n    pipeline: [1, 4]\n    tokens_per_gpu: 16K\n"
                 "    global_batch_tokens: 1M\n")
    items, _ = load_matrix(str(m))
    specs = [s for s, _, _ in items]
    assert [(s.pipeline, s.domain_nodes) for s in specs] == [(1, 8), (4, 2)]
    assert "/pp4/" in specs[1].key() and specs[1].micro_batches == 4 * specs[0].micro_batches
    m.write_text(m.read_text().replace("pipeline: [1, 4]", "pipeline: [3]"))
    with pytest.raises(MatrixError, match="pipeline 3 over 8 nodes"):
        load_matrix(str(m))


def test_dynamic_cp_schedules_the_whole_global_batch_as_megatron_does():
    from megatron_zeppelin.sim.iteration import SimOptions
    from megatron_zeppelin.sim.runs import _global_batch_rounds, _simulate_steps, domain_topology
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.spec.model import load_model
    profile, model = load_profile("a800"), load_model("tiny")
    topo = domain_topology(profile, 1)
    cfg = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node, gpu_nic_map=topo.gpu_to_nic)
    steps = [[3000, 500, 400, 100], [1000, 1000, 1000, 1000], [2000, 1500, 300, 200]]
    plans, rr = _global_batch_rounds(steps, topo, profile, model, cfg, 1024, 1, SimOptions())
    assert sorted(L for p in plans for L in p.lengths) == sorted(itertools.chain(*steps))  # each document once
    assert len(plans) == len(rr.results) and rr.iteration_s == pytest.approx(sum(r.iteration_s for r in rr.results))
    assert [r.allreduce_exposed_s > 0 for r in rr.results] == [False] * (len(plans) - 1) + [True]
    assert max(sum(p.lengths) for p in plans) <= 2 * -(-4000 // topo.world_size) * topo.world_size
    _, piped = _simulate_steps("dynamic_cp", steps, [], topo, profile, model, cfg, 1024, 1, None, stages=2)
    assert piped.iteration_s < rr.iteration_s  # two stages overlap the rounds


def test_a_round_packed_to_the_capacity_always_plans():
    """Filled to the capacity of every rank (as the scheduler packs at it); with more documents than the
    baselines' shapes are weighed for (SMALL_BATCH per rank), Zeppelin's greedy found no room for a
    420-token document in the a800 llama-7b prolong64k iteration's 135-document round, and the plan
    failed: the last resort is dynamic_cp's groups at the capacity, which the scheduler fit."""
    from megatron_zeppelin.planner import make_context, plan_batch
    from megatron_zeppelin.planner.portfolio.shapes import SMALL_BATCH
    from megatron_zeppelin.sim.matrix import load_matrix
    from megatron_zeppelin.sim.memory_fit import domain_topology
    from megatron_zeppelin.sim.runs import run_steps
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.spec.model import load_model
    spec = next(s for s, _, _ in load_matrix(None)[0]
                if s.key().startswith("accumulation/a800/llama-7b-tp1/prolong64k/"))
    prof, model = load_profile("a800"), load_model("llama-7b")
    topo = domain_topology(prof, spec.nodes, spec.tp)
    steps = run_steps(spec, topo.world_size)[0]
    cfg = ZeppelinConfig(gpus_per_node=8, capacity_tokens=4561)  # no recompute: the capacity of the run's first rung
    planned = joint_steps(steps, topo, prof, model, cfg, Accumulation.ROUNDS)[1]
    docs = [L for s in steps for L in s]  # the rounds filled to the capacity (as rounds packed them before round_fill)
    rounds = [[docs[i] for i in m] for m in round_indices(steps, make_context(topo, prof, model, planned).cost, 4561)]
    full = [m for m in rounds if len(m) > SMALL_BATCH * topo.world_size and sum(m) > 0.99 * 4561 * topo.world_size]
    assert full
    for m in full:
        plan = plan_batch(m, topo, prof, model, planned)
        assert max(sum(s.stop - s.start for s in r) for r in plan.attention_layout) <= 4561
