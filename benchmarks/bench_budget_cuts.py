"""What the search budget cut on one configuration of a study: each batch's first micro-batch planned
by Zeppelin with the default budget (``--zeppelin-plan-budget-ms 0``: 10% of the predicted iteration)
and unbounded, at the configuration's recompute and capacity, from its spec in the study file. Prints
and writes each plan's variant, prediction and ``cut_budget``: where the two differ, the budget cut the
candidate that wins unbounded.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_budget_cuts.py --study results/bench/main.json \\
        --label "h200 llama-3b prolong64k 64K 4n 16K/GPU" --out results/budget54/cuts_main.json
"""

from __future__ import annotations

import argparse
import json
import os

import megatron_zeppelin.sim.runs as runs
from megatron_zeppelin.sim.stored import recorded_setup, stored_runs

UNBOUNDED_MS = 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--study", required=True, help="a study file, results/bench/<study>.json")
    ap.add_argument("--label", required=True, help="the configuration's label, as docs/results.md prints it")
    ap.add_argument("--out", required=True, help="JSON output (under results/)")
    args = ap.parse_args(argv)
    spec, rec = stored_runs(args.study, label=args.label)[0]
    profile, model, topo, config = recorded_setup(spec, rec)
    rc, capacity = rec["recompute"], config.capacity_tokens
    rows = []
    for b, steps in enumerate(runs.run_steps(spec, topo.world_size)):
        for budget in (0.0, UNBOUNDED_MS):
            plan = runs.make_plan("zeppelin", steps[0], topo, profile, model, config.with_(plan_budget_ms=budget))
            row = {"batch": b, "budget_ms": budget, "variant": plan.meta.variant,
                   "predicted_s": plan.predicted_iteration_s, "cut_budget": plan.meta.cut_budget or ""}
            rows.append(row)
            print(f"batch {b} {'default' if budget == 0 else 'unbounded'}: {row['variant']} "
                  f"{row['predicted_s']:.4f} s; cut for units: {row['cut_budget'] or '-'}", flush=True)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"study": args.study, "label": args.label, "recompute": rc, "capacity": capacity, "rows": rows},
                  f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
