"""Zeppelin planning of one configuration's first iteration (data order): how many candidates are
prepared and assembled, their time, and how many prepared ones were never assembled.

    PYTHONPATH=. .venv/bin/python results/s60/scripts/prepare_share.py accumulation/h200/llama-13b-tp2/prolong64k/ctx64K/4n/memory/gbs1M
"""
import sys, time, collections
from megatron_zeppelin.sim.matrix import load_matrix
from megatron_zeppelin.sim import runs as R
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.config import ZeppelinConfig
import megatron_zeppelin.planner.strategies as S
import megatron_zeppelin.planner.build.assemble as A
import megatron_zeppelin.planner.partitioner.partition as P
import megatron_zeppelin.planner.portfolio.shapes  # noqa
stats = collections.Counter()
orig_least = S.least_iteration_s
def least(ctx, pre, remap):
    v = orig_least(ctx, pre, remap); stats["least_calls"] += 1; return v
S.least_iteration_s = least
orig_prep = A.prepare
def prep(ctx, pl, costs=True):
    stats["prepare"] += 1; t = time.perf_counter(); out = orig_prep(ctx, pl, costs); stats["prep_s"] += time.perf_counter() - t; return out
P.prepare = prep
orig_asm = S.assemble
def asm(*a, **k):
    stats["assemble"] += 1; t = time.perf_counter(); out = orig_asm(*a, **k); stats["asm_s"] += time.perf_counter() - t; return out
S.assemble = asm
items, _ = load_matrix()
spec = [s for s, v, c in items if sys.argv[1] in s.key()][0]
profile, model = load_profile(spec.cluster), load_model(spec.model)
topo = R.domain_topology(profile, spec.domain_nodes, spec.tp)
runs = R.run_steps(spec, topo.world_size)
cap = R.recompute_rungs(spec)[0]
config = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node, gpu_nic_map=topo.gpu_to_nic,
                        cluster=spec.cluster, tp=spec.tp, capacity_tokens=cap[1], recompute=cap[0], balance_memory=spec.balance_memory)
steps = runs[0][:int(sys.argv[2]) if len(sys.argv) > 2 else None]
t = time.perf_counter(); plans = [R.make_plan("zeppelin+data_order", L, topo, profile, model, config) for L in steps]
print(spec.key(), len(steps), "plan s", round(time.perf_counter() - t, 2), dict(stats))
# second pass: which prepared were never assembled
made, used = {}, set()
def prep2(ctx, pl, costs=True):
    t = time.perf_counter(); out = orig_prep(ctx, pl, costs); made[id(out)] = (out, time.perf_counter() - t); return out
def asm2(*a, **k):
    used.add(id(k.get("prepared"))); return orig_asm(*a, **k)
P.prepare = prep2; S.assemble = asm2
for L in steps: R.make_plan("zeppelin+data_order", L, topo, profile, model, config)
unused = [v[1] for k, v in made.items() if k not in used]
print("prepared", len(made), "never assembled", len(unused), "their prep s", round(sum(unused), 2), "of", round(sum(v[1] for v in made.values()), 2))
