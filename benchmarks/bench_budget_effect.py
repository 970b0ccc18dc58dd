"""What the search budget costs Zeppelin on one configuration of the `accumulation` study: the run
(a800, llama-7b, prolong64k, memory-bound, 1M-token global batches in 9 micro-batches, recompute per
strategy) re-simulated with ``--zeppelin-plan-budget-ms`` set to BUDGET_MS (0: the default, 10% of
the predicted iteration, at least 50 ms; 1e9: unbounded), from the spec stored in
results/bench/accumulation.json. Prints the deployed iteration and which candidates won, writes JSON:

    PYTHONPATH=. .venv/bin/python benchmarks/bench_budget_effect.py 0 --out results/rungs/default.json
    PYTHONPATH=. .venv/bin/python benchmarks/bench_budget_effect.py 1e9 --out results/rungs/unbudgeted.json

Run it with another tree on PYTHONPATH (a `git archive` of an older commit) to compare planners.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time

import megatron_zeppelin.sim.runs as runs
from megatron_zeppelin.sim.stored import stored_runs
from megatron_zeppelin.spec.config import ZeppelinConfig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("budget_ms", type=float, help="--zeppelin-plan-budget-ms (0: the default)")
    ap.add_argument("--study", default="results/bench/accumulation.json")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    runs.ZeppelinConfig = functools.partial(ZeppelinConfig, plan_budget_ms=args.budget_ms)
    out = []
    for spec, _ in stored_runs(args.study, cluster="a800", model="llama-7b", dataset="prolong64k",
                               global_batch_tokens=1 << 20):
        t0 = time.time()
        for rec in runs.run_config(spec, ["zeppelin"]):
            row = {k: rec.get(k) for k in ("label", "variant", "iteration_s", "recompute", "capacity", "tried", "won")}
            row.update(budget_ms=args.budget_ms, wall_s=time.time() - t0)
            print(f"{row['label']} budget {args.budget_ms:g} ms: {row['iteration_s']:.3f} s, won {row['won']}", flush=True)
            out.append(row)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
