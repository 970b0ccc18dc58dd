"""run_config of one matrix configuration (every variant of its study), its records as JSON and its
time, with whichever megatron_zeppelin is first on PYTHONPATH (this tree's, or an older one's)."""
import json
import sys
import time

import megatron_zeppelin
from megatron_zeppelin.sim.matrix import load_matrix
from megatron_zeppelin.sim.runs import run_config

items, _ = load_matrix()
spec, variants, cp = [(s, v, c) for s, v, c in items if sys.argv[1] in s.key()][0]
t0, c0 = time.perf_counter(), time.process_time()
recs = run_config(spec, variants, cp_sizes=cp)
out = {"key": spec.key(), "package": megatron_zeppelin.__file__, "wall_s": time.perf_counter() - t0,
       "cpu_s": time.process_time() - c0, "records": recs}
json.dump(out, open(sys.argv[2], "w"), indent=1, default=str)
print(spec.key(), "wall", round(out["wall_s"], 1), "cpu", round(out["cpu_s"], 1), megatron_zeppelin.__file__)
