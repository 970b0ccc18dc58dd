"""What ``--zeppelin-balance-memory`` costs: Zeppelin's plans of the matrix's runs without and with it.

With the flag Zeppelin plans every batch with both layouts of every rank within 1.10x the batch's
mean tokens (planner/memory_choice.plan_memory_first), so each rank's peak activation memory is
within 1.10x the mean. Per batch this writes, for both: the predicted iteration (with the DP
all-reduce), the per-rank peak activation memory max / mean (dp/memory.plan_memory_balance, the
run's recompute), the winning variant and the planning time (one Planner per run, as the Megatron-LM
forward step holds it; median of ``--repeats`` after a first plan); then, over all batches, the
memory's mean and max, the batches within 1.10, the predicted price (with / without: mean, median,
max) and the planning time ratio.

Runs (``RUNS``): the matrix's configurations (sim/matrix.batch_and_recompute: "auto" recompute at
16K tokens per GPU, or memory-bound) where Zeppelin's plans are the least balanced in
docs/results.md, 4 nodes of 8 GPUs, 64K context.

    .venv/bin/python benchmarks/bench_balance_memory.py --batches 4 --out out/balance_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.memory import plan_memory_balance
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner import Planner
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.sim.matrix import batch_and_recompute
from megatron_zeppelin.sim.runs import RunSpec, domain_topology, run_lengths

# (cluster, model, TP, dataset, tokens per GPU or "memory", recompute)
RUNS = (("a800", "llama-7b", 1, "prolong64k", 16384, "auto"), ("h200", "llama-3b", 1, "prolong64k", 16384, "auto"),
        ("h800", "llama-7b", 1, "github", 16384, "auto"), ("a800", "llama-3b", 1, "arxiv", 16384, "auto"),
        ("h800", "llama-13b", 2, "arxiv", 16384, "auto"), ("h800", "llama-3b", 1, "github", "memory", "none"),
        ("h200", "llama-7b", 1, "github", "memory", "none"), ("a800", "llama-3b", 1, "github", "memory", "none"))
BALANCE = 1.10


def _timed(planner: Planner, lengths, repeats: int):
    plan = planner.plan(lengths)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        planner.plan(lengths)
        times.append(time.perf_counter() - t0)
    return plan, statistics.median(times)


def run_case(case, batches: int, repeats: int) -> list:
    """Per batch of run ``case``: Zeppelin without and with --zeppelin-balance-memory."""
    cl, model_name, tp, dataset, per_gpu, recompute = case
    per_gpu, capacity, recompute = batch_and_recompute(cl, model_name, tp, 4, per_gpu, recompute)
    profile, model = load_profile(cl), load_model(model_name)
    topo = domain_topology(profile, 4, tp)
    spec = RunSpec("balance_memory", cl, model_name, tp, dataset, 65536, 4, per_gpu, capacity=capacity,
                   batches=batches, recompute=recompute)
    config = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                            gpu_nic_map=topo.gpu_to_nic, cluster=cl, tp=tp, capacity_tokens=capacity,
                            recompute=recompute)
    planners = {"default": Planner(topo, profile, model, config),
                "balance_memory": Planner(topo, profile, model, config.with_(balance_memory=True))}
    rows = []
    for b, lengths in enumerate(run_lengths(spec, topo.world_size)):
        row = {"run": "/".join(map(str, case)), "batch": b, "documents": len(lengths), "recompute": recompute}
        for name, planner in planners.items():
            plan, dt = _timed(planner, lengths, repeats)
            mem = plan_memory_balance(plan, model, tp, recompute)
            row[name] = {"predicted_s": plan.predicted_with_allreduce_s, "memory_imbalance": mem["imbalance"],
                         "peak_activation_GB": mem["max_bytes"] / 1e9, "variant": plan.meta.variant,
                         "token_cap": plan.meta.token_cap, "plan_ms": 1e3 * dt}
        rows.append(row)
    return rows


def summarize(rows: list) -> dict:
    d = [r["default"] for r in rows]
    m = [r["balance_memory"] for r in rows]
    price = [y["predicted_s"] / x["predicted_s"] for x, y in zip(d, m)]
    plan = [y["plan_ms"] / x["plan_ms"] for x, y in zip(d, m)]

    def mem(xs):
        v = [x["memory_imbalance"] for x in xs]
        return {"mean": statistics.mean(v), "max": max(v), "within_1.10": sum(x <= BALANCE + 1e-9 for x in v)}
    return {"batches": len(rows), "memory_default": mem(d), "memory_balance_memory": mem(m),
            "price": {"mean": statistics.mean(price), "median": statistics.median(price), "max": max(price),
                      "min": min(price)},
            "plan_time_ratio": {"median": statistics.median(plan), "max": max(plan)},
            "plan_ms_median": {"default": statistics.median(x["plan_ms"] for x in d),
                               "balance_memory": statistics.median(x["plan_ms"] for x in m)}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=4, help="the first batches of each run")
    ap.add_argument("--repeats", type=int, default=3, help="timed plans per batch (after the first)")
    ap.add_argument("--runs", type=int, default=len(RUNS), help="the first N of RUNS")
    ap.add_argument("--out", default="out/balance_memory.json")
    a = ap.parse_args(argv)
    rows = []
    for case in RUNS[:a.runs]:
        for r in run_case(case, a.batches, a.repeats):
            x, y = r["default"], r["balance_memory"]
            print(f"{r['run']} batch {r['batch']}: memory {x['memory_imbalance']:.3f} -> {y['memory_imbalance']:.3f}, "
                  f"predicted {x['predicted_s']:.3f} -> {y['predicted_s']:.3f} s "
                  f"({y['predicted_s'] / x['predicted_s']:.3f}x), planning {x['plan_ms']:.0f} -> {y['plan_ms']:.0f} ms",
                  flush=True)
            rows.append(r)
    s = summarize(rows)
    print(f"over {s['batches']} batches: memory max/mean mean {s['memory_default']['mean']:.3f} -> "
          f"{s['memory_balance_memory']['mean']:.3f} (max {s['memory_default']['max']:.3f} -> "
          f"{s['memory_balance_memory']['max']:.3f}; within 1.10 in {s['memory_default']['within_1.10']} -> "
          f"{s['memory_balance_memory']['within_1.10']}); predicted iteration x{s['price']['mean']:.3f} mean, "
          f"x{s['price']['median']:.3f} median, x{s['price']['max']:.3f} max, x{s['price']['min']:.3f} min; planning "
          f"time x{s['plan_time_ratio']['median']:.2f} median ({s['plan_ms_median']['default']:.0f} -> "
          f"{s['plan_ms_median']['balance_memory']:.0f} ms)", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"command": "benchmarks/bench_balance_memory.py", "args": vars(a), "summary": s, "batches": rows},
                  f, indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
