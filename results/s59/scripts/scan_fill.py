"""Which rounds configurations the node rule changes: batch 0's (share, node, cap)."""
from megatron_zeppelin.sim.matrix import load_matrix
from megatron_zeppelin.sim import runs as R
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.planner import make_context
from megatron_zeppelin.planner.accumulation import round_fill
items, _ = load_matrix()
n = 0
for spec, variants, _ in items:
    if not spec.global_batch_tokens or "zeppelin" not in variants:
        continue
    profile, model = load_profile(spec.cluster), load_model(spec.model)
    topo = R.domain_topology(profile, spec.domain_nodes, spec.tp)
    rc, cap = R.recompute_rungs(spec)[0]
    config = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node, gpu_nic_map=topo.gpu_to_nic,
        cluster=spec.cluster, tp=spec.tp, capacity_tokens=cap, recompute=rc, balance_memory=spec.balance_memory)
    ch = []
    for steps in R.run_steps(spec, topo.world_size):
        ctx = make_context(topo, profile, model, config, total_tokens=max(sum(s) for s in steps))
        a = round_fill(steps, topo.world_size, ctx.capacity); b = round_fill(steps, topo.world_size, ctx.capacity, topo.gpus_per_node)
        ch.append((a[0], b[0], a[1]))
    n += 1
    if any(x[0] != x[1] for x in ch):
        print(spec.key(), "rpn", topo.gpus_per_node, ch)
print(n, "configs")
