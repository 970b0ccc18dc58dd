"""run_config of one matrix configuration, every variant of its study: deployed recompute, time, tried."""
import sys, time, json
from megatron_zeppelin.sim.matrix import load_matrix
from megatron_zeppelin.sim.runs import run_config
items, _ = load_matrix()
spec, variants, cp = [(s, v, c) for s, v, c in items if sys.argv[1] in s.key()][0]
t = time.perf_counter()
recs = run_config(spec, variants, cp_sizes=cp)
print(spec.key(), "in", round(time.perf_counter() - t, 1), "s")
for r in recs:
    print(f"{r['variant']:22s} {r.get('recompute', '-'):36s} {r.get('iteration_s') or 0:9.3f}  tried {r.get('tried')}")
if len(sys.argv) > 2:
    json.dump(recs, open(sys.argv[2], "w"), indent=1, default=str)
