"""Batch b of a config: Zeppelin on rounds at least fill / capacity fill / dynamic_cp's own rounds, vs dynamic_cp."""
import sys, time
from megatron_zeppelin.sim.matrix import load_matrix
from megatron_zeppelin.sim import runs as R
from megatron_zeppelin.sim.iteration import simulate, accumulate
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner import make_context
from megatron_zeppelin.planner.accumulation import joint_indices, round_fill
from megatron_zeppelin.planner.baselines.dynamic_cp import round_placements
from megatron_zeppelin.spec.words import Accumulation
items, _ = load_matrix()
spec = next(s for s, v, c in items if sys.argv[1] in s.key())
b = int(sys.argv[2]) if len(sys.argv) > 2 else 0
profile, model = load_profile(spec.cluster), load_model(spec.model)
topo = R.domain_topology(profile, spec.domain_nodes, spec.tp)
steps = R.run_steps(spec, topo.world_size)[b]
rc, cap = R.recompute_rungs(spec)[0]
config = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node, gpu_nic_map=topo.gpu_to_nic,
    cluster=spec.cluster, tp=spec.tp, capacity_tokens=cap, recompute=rc, balance_memory=spec.balance_memory)
largest = max(sum(s) for s in steps)
ctx = make_context(topo, profile, model, config, total_tokens=largest)
docs = [L for s in steps for L in s]
least, most = round_fill(steps, topo.world_size, ctx.capacity)
print(spec.key(), "batch", b, "k", len(steps), "least", least, "cap", ctx.capacity, flush=True)
t = time.time()
dplans, rr = R._global_batch_rounds(steps, topo, profile, model, config, ctx.capacity, spec.tp, R.SimOptions() if hasattr(R, "SimOptions") else None)
print(f"dynamic_cp rounds {len(dplans)} sim {rr.iteration_s:.3f} pred {sum(max(c.total_s for c in p.cost) for p in dplans):.3f} ({time.time()-t:.0f} s)", flush=True)
cfg = config.with_(capacity_tokens=ctx.capacity)
g = topo.gpus_per_node; node = -(-max(docs) // g)
print("node fill", node, "ranks/node", g)
groupings = {"least": None, "cap": (most, most)}
if least < node <= most: groupings["node"] = (node, most)
import os
if os.environ.get("ONLY"): groupings = {k: v for k, v in groupings.items() if k in os.environ["ONLY"].split(",")}
for name, fill in groupings.items():
    t = time.time()
    groups = [[docs[i] for i in m] for m in joint_indices(steps, ctx.cost, ctx.capacity, topo.world_size, Accumulation.ROUNDS, fill)]
    plans = [R.make_plan("zeppelin+rounds", g, topo, profile, model, cfg, None) for g in groups]
    res = accumulate([simulate(p, profile, model, tp=spec.tp) for p in plans])
    pred = sum(max(c.total_s for c in p.cost) for p in plans)
    print(f"{name:8s} rounds {[len(g) for g in groups]} sim {res.iteration_s:.3f} pred {pred:.3f} ({time.time()-t:.0f} s) {[p.meta.variant for p in plans]}", flush=True)
pooled = [int(L) for L in docs]
rp = round_placements(pooled, ctx, ctx.capacity)
if len(rp) == len(steps) and not os.environ.get("ONLY"):
    t = time.time()
    groups = [[pooled[i] for i in d] for d, _ in rp]
    plans = [R.make_plan("zeppelin+rounds", g, topo, profile, model, cfg, None) for g in groups]
    res = accumulate([simulate(p, profile, model, tp=spec.tp) for p in plans])
    pred = sum(max(c.total_s for c in p.cost) for p in plans)
    print(f"dynrounds rounds {[len(g) for g in groups]} sim {res.iteration_s:.3f} pred {pred:.3f} ({time.time()-t:.0f} s) {[p.meta.variant for p in plans]}", flush=True)
