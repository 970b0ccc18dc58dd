"""Every Ulysses ring time the batch memo returns (ulysses_rings._priced) equals the ring priced on
its own ranks afresh: bench_planner's run and latency cases and five matrix configurations.

    PYTHONPATH=. .venv/bin/python results/s62/scripts/verify_ring_memo.py
"""
import sys
sys.path.insert(0, 'benchmarks'); sys.path.insert(0, 'tests/unit')
import numpy as np
import megatron_zeppelin.planner.partitioner.ulysses_rings as U
n = [0, 0]
orig = U._priced
first = {}
moved = [0]
def checked(ring, docs, ctx):
    key = (ring.comm, ring.size, ring.a2a, tuple((docs[d].length, tuple(docs[d].bounds)) for d in ring.docs))
    if key in first and first[key] != tuple(ring.ranks): moved[0] += 1
    first.setdefault(key, tuple(ring.ranks))
    got = orig(ring, docs, ctx)
    direct = U.ring_seconds(ring, docs, ctx)
    n[0] += 1
    if got != direct:
        n[1] += 1; print("MISMATCH", ring, got, direct)
    return got
U._priced = checked
import bench_planner as bp
from bench_scripts import load_bench
B = load_bench("bench_plan_attribution")
from megatron_zeppelin.planner import Planner
for k in range(len(bp.RUN_CASES)):
    B.run_case(k)
for c in bp.LATENCY_CASES[::2]:
    B.latency_case(*c)
import megatron_zeppelin.sim.runs as R
from megatron_zeppelin.sim.matrix import load_matrix
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.model import load_model
items, _ = load_matrix()
for key in ("accumulation/h200/llama-7b-tp1/arxiv", "accumulation/a800/llama-13b-tp2/github", "accumulation_70b/h200/llama3-70b-tp8/github", "main/h800/llama-13b-tp2/prolong64k", "robustness/a800/llama-7b-tp1/github/ctx64K/2n/err0.25-s1"):
    spec = [s for s, v, c in items if key in s.key()][0]
    profile, model = load_profile(spec.cluster), load_model(spec.model)
    topo = R.domain_topology(profile, spec.domain_nodes, spec.tp)
    rc, cap = R.recompute_rungs(spec)[0]
    config = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node, gpu_nic_map=topo.gpu_to_nic, cluster=spec.cluster, tp=spec.tp, capacity_tokens=cap or spec.capacity, recompute=rc)
    steps = R.run_steps(spec, topo.world_size)[0]
    for lengths in steps[:4]:
        try:
            R.make_plan("zeppelin", lengths, topo, profile, model, config)
        except Exception as e:
            print(key, "error", e)
    print(key, "checked", n)
print("calls", n[0], "mismatches", n[1], "hits on other ranks", moved[0])
