"""benchmarks/bench_plan_attribution.py: every CPU second of a plan lands in one step, each fixed shape
weighed gets its units, and the planner's functions are restored after (times are never asserted)."""

import numpy as np
from bench_scripts import load_bench

import megatron_zeppelin.planner.partitioner.partition as partition
import megatron_zeppelin.planner.strategies as strategies
from megatron_zeppelin.planner import Planner
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.topology import Topology


def test_steps_cover_the_plan_and_the_search_is_restored():
    bench = load_bench("bench_plan_attribution")
    before = (partition.prepare, partition._choose, partition.candidate_placements, strategies.assemble)
    prof, model = load_profile("a800"), load_model("llama-7b")
    topo = Topology(2, 8, prof.nics_per_node, prof.gpu_to_nic)
    lengths = np.random.default_rng(0).lognormal(7.5, 1.3, 40).clip(1, 65536).astype(np.int64)  # 2.5 a rank: shapes
    r = bench.attribute(Planner(topo, prof, model, ZeppelinConfig(gpus_per_node=8)), lengths)
    assert (partition.prepare, partition._choose, partition.candidate_placements, strategies.assemble) == before
    assert set(r["steps"]) == set(bench.STEPS) and all(s >= 0 for s in r["steps"].values())
    assert sum(r["steps"].values()) >= r["cpu_s"] > 0  # the steps nest inside "other", which spans the plan
    assert r["steps"]["greedy"] > 0 and r["steps"]["weigh and assemble"] > 0
    assert r["shapes"] and all(s["units"] > 0 and s["cpu_s"] >= 0 for s in r["shapes"])
    assert r["docs"] == 40 and r["ranks"] == 16 and r["share_of_iteration"] > 0
