"""Memory-bound batches: the capacity memory allows, enforced for every strategy, and Zeppelin's
aligned-ring variant (which tight capacities call for)."""

import numpy as np
import pytest

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.memory import activation_bytes_per_token, capacity_tokens, predict_memory
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner import PlanError, plan_batch
from megatron_zeppelin.planner.partitioner.partition import _Ranks, _intra, _intra_aligned
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.sim.matrix import load_matrix, memory_tokens
from megatron_zeppelin.sim.runs import domain_topology
from megatron_zeppelin.data.workloads import sample_batch


def test_capacity_is_what_memory_leaves_for_activations():
    m = load_model("llama-7b")
    cap = capacity_tokens(m, 80e9, dp=32)
    full = predict_memory(m, cap, dp=32, zero_stage=1).total
    assert full <= 0.9 * 80e9 < full + activation_bytes_per_token(m)  # the largest count that fits
    assert capacity_tokens(m, 80e9, dp=32, recompute=True) > 5 * cap  # recompute keeps far less
    assert capacity_tokens(m, 10e9, dp=1) == 0  # the states alone do not fit


def test_memory_tokens_fill_the_capacity_and_a_64k_document_needs_many_gpus():
    per_gpu, cap = memory_tokens("a800", "llama-7b", 1, 4)
    assert per_gpu == int(0.8 * cap)
    assert 4 * 1024 < cap < 8 * 1024  # 7B on 80 GB without recompute: a few thousand tokens
    assert 65536 > 8 * cap  # a 64K document cannot stay inside one node of 8 GPUs


def _memory_batch(dataset="prolong64k", cluster="a800", model="llama-7b", nodes=4):
    per_gpu, cap = memory_tokens(cluster, model, 1, nodes)
    profile, spec = load_profile(cluster), load_model(model)
    topo = domain_topology(profile, nodes)
    lengths = [int(x) for x in sample_batch(dataset, per_gpu * topo.world_size, 0, max_len=65536)]
    cfg = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                         gpu_nic_map=topo.gpu_to_nic, capacity_tokens=cap)
    return lengths, topo, profile, spec, cfg, cap


def test_a_set_capacity_binds_every_strategy():
    lengths, topo, profile, spec, cfg, cap = _memory_batch()
    assert max(lengths) > 8 * cap
    with pytest.raises(PlanError, match="packed_dp runs out of memory.*--zeppelin-capacity-tokens"):
        plan_batch(lengths, topo, profile, spec, cfg, strategy="packed_dp")
    for s in ("zeppelin", "static_cp", "dynamic_cp", "hybrid_dp"):
        plan = plan_batch(lengths, topo, profile, spec, cfg, strategy=s)
        for r in range(topo.world_size):
            assert plan.tokens(r) <= cap, (s, r)
            assert sum(x.stop - x.start for x in plan.linear_layout[r]) <= cap, (s, r)
    static = plan_batch(lengths, topo, profile, spec, cfg, strategy="static_cp")
    assert int(dict(static.meta)["cp_size"]) > topo.gpus_per_node  # memory forces TE-style CP across nodes


def test_aligned_intra_rings_take_a_power_of_two_block_of_one_node():
    ranks = _Ranks(8, 100)
    for r, t in enumerate([5.0, 0.0, 1.0, 1.0, 0.0, 0.0, 9.0, 0.0]):
        ranks.add(r, t, 1, 0.0)
    sizes = np.arange(2, 5)  # one node of 4 GPUs, two nodes
    member, need, ok = np.array([1.0, 1.0, 1.0]), np.array([1, 1, 1]), np.ones(3, dtype=bool)
    free = _intra(ranks, 4, sizes, member, need, ok, budget=0.0)
    aligned = _intra_aligned(ranks, 4, sizes, member, need, ok, budget=0.0)
    assert free[2] == (4, 5)  # the two least-loaded ranks of node 1
    assert aligned[2] == (4, 5)  # block [4, 6): its busiest member holds 0
    ranks.add(5, 3.0, 1, 0.0)  # now node 1's two least-loaded ranks, 4 and 7, are no aligned block
    assert _intra(ranks, 4, sizes, member, need, ok, budget=0.0)[2] == (4, 7)
    assert _intra_aligned(ranks, 4, sizes, member, need, ok, budget=0.0)[2] == (2, 3)


def test_zeppelin_keeps_the_better_ring_layout_under_a_tight_capacity():
    lengths, topo, profile, spec, cfg, cap = _memory_batch("arxiv", "h200", "llama-3b")
    plan = plan_batch(lengths, topo, profile, spec, cfg, strategy="zeppelin")
    for s in ("static_cp", "dynamic_cp", "hybrid_dp"):  # predicted: the chosen variant beats them all
        assert plan.predicted_iteration_s <= plan_batch(lengths, topo, profile, spec, cfg, strategy=s).predicted_iteration_s
    assert "aligned" in dict(plan.meta)["variant"]


def test_matrix_memory_studies_expand_with_their_capacity():
    items, _ = load_matrix("megatron_zeppelin/presets/runs/paper.yaml")
    mem = [spec for spec, _, _ in items if spec.study == "memory"]
    assert mem and all(spec.capacity > 0 and spec.tokens_per_gpu == int(0.8 * spec.capacity) for spec in mem)
    main = [spec for spec, _, _ in items if spec.study == "main"]
    # 16K tokens per GPU: physically realisable, with the fastest recompute that holds them, binding
    assert main and all(spec.capacity > 0 and spec.tokens_per_gpu <= 0.8 * spec.capacity for spec in main)
    assert {spec.recompute for spec in main if spec.model == "llama-7b" and spec.cluster == "a800"} == {"full"}


def test_aligned_rings_keep_documents_on_the_smallest_rings_memory_allows():
    # 30B with TP 4 on 80 GB: ~2.4K tokens per rank, two nodes of 2 ranks per 4-rank ring. Free rings
    # spread both documents over all 4 nodes (each rank then receives nearly all K/V of both); the
    # aligned variant's unbounded pass keeps each on its own 4-rank block, as TE CP 4 does.
    per_gpu, cap = memory_tokens("a800", "llama-30b", 4, 4)
    profile, spec = load_profile("a800"), load_model("llama-30b")
    topo = domain_topology(profile, 4, 4)
    lengths = [6012, 9060]
    cfg = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                         gpu_nic_map=topo.gpu_to_nic, tp=4, capacity_tokens=cap)
    z = plan_batch(lengths, topo, profile, spec, cfg, strategy="zeppelin")
    s = plan_batch(lengths, topo, profile, spec, cfg, strategy="static_cp")
    assert sorted(r.ranks for r in z.rings) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert z.predicted_iteration_s <= s.predicted_iteration_s * (1 + 1e-9)


def test_a_long_document_of_the_memory_batch_takes_an_aligned_block():
    # llama-7b on H800 with the batch memory allows: a 64K document needs 15+ ranks, on 16 (2 nodes) or
    # all 32. The partitioner's aligned pass keeps it on one 16-rank block (1.152 s predicted); while
    # the aligned rings were weighed inside the search budget they were cut here, and the free ring
    # over all 32 won (1.280 s). (p2p shapes only: the a2a shape over all 32 ranks wins otherwise.)
    lengths, topo, profile, spec, cfg, cap = _memory_batch("prolong64k", "h800", "llama-7b")
    plan = plan_batch(lengths, topo, profile, spec, cfg.with_(cp_comm="p2p"), strategy="zeppelin")
    assert [r.size for r in plan.rings if r.cls == "inter"] == [16]
    assert plan.meta.variant.split("/")[2] == "aligned"
    unbounded = plan_batch(lengths, topo, profile, spec, cfg.with_(cp_comm="p2p", plan_budget_ms=1e9),
                           strategy="zeppelin")
    assert plan.predicted_iteration_s == unbounded.predicted_iteration_s
    aligned16 = plan_batch(lengths, topo, profile, spec, cfg.with_(cp_comm="p2p", cp_size=16), strategy="static_cp")
    assert plan.predicted_iteration_s <= aligned16.predicted_iteration_s


def test_the_accumulation_study_takes_global_batches_and_leaves_the_others_alone():
    from megatron_zeppelin.sim.matrix import micro_batches
    from megatron_zeppelin.sim.runs import domain_topology
    from megatron_zeppelin.spec.hardware import load_profile
    items, _ = load_matrix("megatron_zeppelin/presets/runs/paper.yaml")
    acc = [spec for spec, _, _ in items if spec.study in ("accumulation", "accumulation_4m")]
    assert {spec.global_batch_tokens for spec in acc} == {1 << 20, 4 << 20}
    assert {spec.model for spec in acc} == {"llama-7b", "llama-13b", "llama3-8b"}
    assert {spec.cluster for spec in acc} == {"a800", "h200"}
    for spec in acc:  # micro-batches of what memory holds, as many as the global batch needs
        world = domain_topology(load_profile(spec.cluster), spec.nodes, spec.tp).world_size
        assert spec.regime == "memory" and spec.recompute_per_strategy and spec.micro_batches > 1
        assert spec.micro_batches == micro_batches(spec.global_batch_tokens, spec.tokens_per_gpu, world)
        assert abs(spec.micro_batches * spec.tokens_per_gpu * world / spec.global_batch_tokens - 1) < 0.1
    # the studies of global batches: accumulation (its 4M and 70B twins) and pipeline; the others take one
    others = [spec for spec, _, _ in items
              if spec.study not in ("accumulation", "accumulation_4m", "accumulation_70b", "pipeline")]
    assert all(s.micro_batches == 1 and not s.global_batch_tokens and not s.recompute_per_strategy for s in others)
    assert len({spec.key() for spec, _, _ in items}) == len(items)
