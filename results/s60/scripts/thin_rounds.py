"""rounds at fills below round_fill's least (thinner rounds: all k micro-batches rounds, none nearly
empty), one iteration of a stored accumulation configuration, simulated micro-batch by micro-batch.

    PYTHONPATH=. .venv/bin/python results/s60/scripts/thin_rounds.py results/bench/accumulation_70b.json \\
        "h200 llama3-70b tp8 github 64K 4n mem gbs 1M x28" 0 1.0 0.95 0.9 0.85
"""
import sys
sys.path.insert(0, "benchmarks")
from bench_accumulation_assign import _micro_batches  # noqa: E402
from megatron_zeppelin.planner import make_context  # noqa: E402
from megatron_zeppelin.planner.accumulation import joint_indices, joint_steps, round_fill  # noqa: E402
from megatron_zeppelin.sim import runs  # noqa: E402
from megatron_zeppelin.sim.stored import recorded_setup, stored_runs  # noqa: E402
from megatron_zeppelin.spec.words import Accumulation  # noqa: E402

study, label, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
spec, rec = stored_runs(study, label=label)[0]
profile, model, topo, config = recorded_setup(spec, rec)
steps = runs.run_steps(spec, topo.world_size)[batch]
c = joint_steps(steps, topo, profile, model, config, Accumulation.ROUNDS)[1]
ctx = make_context(topo, profile, model, c)
docs = [L for s in steps for L in s]
least, most = round_fill(steps, topo.world_size, ctx.capacity, topo.gpus_per_node if spec.pipeline <= 1 else 0)
for f in map(float, sys.argv[4:]):
    idx = joint_indices(steps, ctx.cost, ctx.capacity, topo.world_size, Accumulation.ROUNDS, (int(least * f), most))
    mbs = _micro_batches([[docs[i] for i in m] for m in idx], topo, profile, model, c, spec.tp)
    thin = sum(1 for m in mbs if m["documents"] == 1 and m["tokens"] < 100)
    print(f"least x {f:.2f} = {int(least * f)} tokens a rank: {len(mbs)} micro-batches ({thin} of one short document), "
          f"simulated {sum(m['simulated_s'] for m in mbs):.3f} s")
