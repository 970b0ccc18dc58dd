"""How much of a run's planning is the partitioner's, which the search budget never cuts: the matrix
runs of ``bench_planner.py`` (RUN_CASES), each batch planned with the default budget and with a budget
too small for any candidate after the partitioner (its free and aligned rings alone), CPU medians over
``--repeats`` plans of one Planner per run (the forward step's), beside the predicted iteration. Writes JSON:

    PYTHONPATH=. .venv/bin/python benchmarks/bench_partitioner_share.py --out results/s51/partitioner_share.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_planner  # noqa: E402  (its run cases and config)

from megatron_zeppelin.planner import Planner  # noqa: E402
from megatron_zeppelin.sim.matrix import batch_and_recompute  # noqa: E402
from megatron_zeppelin.sim.runs import RunSpec, domain_topology, run_lengths  # noqa: E402
from megatron_zeppelin.spec.hardware import load_profile  # noqa: E402
from megatron_zeppelin.spec.model import load_model  # noqa: E402

PARTITIONER_ONLY_MS = 1e-6  # no unit left after the partitioner: every later candidate is cut


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True, help="JSON output (under results/)")
    args = ap.parse_args(argv)
    rows = []
    for cl, model_name, tp, dataset, context, nodes, per_gpu, recompute in bench_planner.RUN_CASES:
        per_gpu, capacity, recompute = batch_and_recompute(cl, model_name, tp, nodes, per_gpu, recompute)
        prof, model = load_profile(cl), load_model(model_name)
        topo = domain_topology(prof, nodes)
        spec = RunSpec("share", cl, model_name, tp, dataset, context, nodes, per_gpu, capacity=capacity, batches=3,
                       recompute=recompute)
        row = {"run": f"{cl}/{model_name}/{dataset}", "tokens_per_gpu": per_gpu, "ranks": topo.world_size}
        for name, ms in (("partitioner_only", PARTITIONER_ONLY_MS), ("default", 0.0)):
            cfg = bench_planner._config(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                                        gpu_nic_map=topo.gpu_to_nic, cluster=cl, recompute=recompute, tp=tp,
                                        capacity_tokens=capacity, plan_budget_ms=ms)
            planner = Planner(topo, prof, model, cfg)
            cpu, its = [], []
            for lengths in run_lengths(spec, topo.world_size):
                planner.plan(lengths)  # warm-up
                for _ in range(args.repeats):
                    c0 = time.process_time()
                    plan = planner.plan(lengths)
                    cpu.append(time.process_time() - c0)
                its.append(plan.predicted_iteration_s)
            row[name + "_ms"] = 1e3 * statistics.median(cpu)
            row[name + "_iteration_s"] = statistics.mean(its)
        it = row["default_iteration_s"]
        row["partitioner_share"], row["default_share"] = row["partitioner_only_ms"] / 1e3 / it, row["default_ms"] / 1e3 / it
        rows.append(row)
        print(f"{row['run']} ({per_gpu} tokens a GPU): partitioner alone {row['partitioner_only_ms']:.0f} ms "
              f"({row['partitioner_share']:.1%}), default {row['default_ms']:.0f} ms ({row['default_share']:.1%}) "
              f"of a {it:.3f} s iteration", flush=True)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "load_average": os.getloadavg()[0]}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
