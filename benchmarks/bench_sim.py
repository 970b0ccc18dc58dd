"""Simulator latency: seconds to simulate one iteration of a plan (median of repeats), by domain size.

    .venv/bin/python benchmarks/bench_sim.py --nodes 4 16 --out benchmarks/results/sim_latency.json

The matrix (`zeppelin bench`) simulates hundreds of plans; this shows what one costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_zeppelin.spec.config import ZeppelinConfig  # noqa: E402
from megatron_zeppelin.spec.model import load_model  # noqa: E402
from megatron_zeppelin.spec.hardware import load_profile  # noqa: E402
from megatron_zeppelin.sim.iteration import simulate  # noqa: E402
from megatron_zeppelin.sim.runs import domain_topology, make_plan  # noqa: E402
from megatron_zeppelin.data.workloads import sample_batch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/sim_latency.json")
    args = ap.parse_args()
    prof, model = load_profile("a800"), load_model("llama-3b")
    rows = []
    for nodes in args.nodes:
        topo = domain_topology(prof, nodes)
        lengths = [int(x) for x in sample_batch("github", 65536 * topo.world_size, 0, max_len=65536)]
        cfg = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                             gpu_nic_map=topo.gpu_to_nic)
        for variant, cp in (("zeppelin", 0), ("static_cp", 4), ("static_cp", 16)):
            plan = make_plan(variant, lengths, topo, prof, model, cfg.with_(cp_size=cp))
            ts = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                res = simulate(plan, prof, model)
                ts.append(time.perf_counter() - t0)
            rows.append({"nodes": nodes, "ranks": topo.world_size, "variant": variant, "cp_size": cp,
                         "documents": len(lengths), "ops": len(plan.schedule), "sim_s": statistics.median(ts),
                         "iteration_s": res.iteration_s})
            print(f"{topo.world_size:4d} ranks {variant:<10} cp {cp:<3} {len(plan.schedule):6d} ops: "
                  f"simulated in {statistics.median(ts):.3f} s (iteration {res.iteration_s:.3f} s)")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "simulator latency", "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
