"""cProfile of a steady Planner's plan (lognormal batch as bench_planner's latency cases), sorted by
tottime and cumtime: where the planning time goes. Usage: profile_small.py DOCS NODES [REPEATS]."""
import cProfile
import pstats
import sys
import time

import numpy as np

from megatron_zeppelin.planner import Planner
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.topology import Topology

n, nodes = int(sys.argv[1]), int(sys.argv[2])
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
prof, model = load_profile("a800"), load_model("llama-7b")
lengths = np.random.default_rng(0).lognormal(7.5, 1.3, n).clip(1, 65536).astype(np.int64)
planner = Planner(Topology(nodes, 8, prof.nics_per_node, prof.gpu_to_nic), prof, model, ZeppelinConfig(gpus_per_node=8))
planner.plan(lengths)
c0 = time.process_time()
for _ in range(reps):
    plan = planner.plan(lengths)
print(f"cpu ms per plan {1e3 * (time.process_time() - c0) / reps:.1f}; variant {plan.meta.variant}; "
      f"cut_bound {plan.meta.cut_bound!r}; cut_budget {plan.meta.cut_budget!r}")
pr = cProfile.Profile()
pr.enable()
for _ in range(reps):
    planner.plan(lengths)
pr.disable()
st = pstats.Stats(pr)
st.sort_stats("cumtime").print_stats(40)
st.sort_stats("tottime").print_stats(25)
