"""What the search budget costs Zeppelin's predictions, at planning rates: the first micro-batches of
each configuration of the given study files, planned by Zeppelin unbounded and with the default budget
(10% of the predicted iteration) converted at each ``--rates`` value (units per CPU second,
spec/config.PLAN_RATE_UNITS_PER_S is the default one), at each configuration's deployed recompute and
capacity. Prints and writes, per rate, the summed prediction against the unbounded one, the planning
CPU seconds and the micro-batches where the budget cut the winner:

    PYTHONPATH=. .venv/bin/python benchmarks/bench_budget_loss.py --studies results/bench/accumulation.json \\
        --micro-batches 2 --rates 3.2e4 4.9e4 --out results/rate51/budget_loss_accumulation.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time

import megatron_zeppelin.planner.strategies as strategies
import megatron_zeppelin.sim.runs as runs
from megatron_zeppelin.planner.choice import SearchBudget
from megatron_zeppelin.sim.stored import recorded_setup, stored_runs

UNBOUNDED_MS = 1e9


def _cases(studies, micro_batches: int):
    for path in studies:
        for spec, rec in stored_runs(path):
            if rec.get("error"):
                continue
            profile, model, topo, config = recorded_setup(spec, rec)
            steps = runs.run_steps(spec, topo.world_size)[0]
            for m in range(min(len(steps), micro_batches)):
                yield spec.label(), m, steps[m], topo, profile, model, config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--studies", nargs="+", required=True, help="study files, results/bench/<study>.json")
    ap.add_argument("--micro-batches", type=int, default=1, help="micro-batches of each configuration's first batch")
    ap.add_argument("--rates", nargs="+", type=float, required=True, help="planning rates, units per CPU second")
    ap.add_argument("--out", required=True, help="JSON output (under results/)")
    args = ap.parse_args(argv)
    names = ["unbounded"] + [f"rate {r:g}" for r in args.rates]
    rows = []
    try:
        for label, m, lengths, topo, profile, model, config in _cases(args.studies, args.micro_batches):
            row = {"label": label, "micro_batch": m}
            for name, rate in zip(names, [None] + args.rates):
                strategies.SearchBudget = functools.partial(SearchBudget, rate=rate or SearchBudget.rate)
                cfg = config.with_(plan_budget_ms=UNBOUNDED_MS) if rate is None else config
                c0 = time.process_time()
                plan = runs.make_plan("zeppelin", lengths, topo, profile, model, cfg)
                row[name] = {"predicted_s": plan.predicted_iteration_s, "cpu_s": time.process_time() - c0,
                             "variant": plan.meta.variant}
            rows.append(row)
            print(f"[{len(rows)}] {label} #{m}: " + ", ".join(
                f"{n} {row[n]['predicted_s']:.3f} s" for n in names), flush=True)
    finally:
        strategies.SearchBudget = SearchBudget
    summary = {}
    for n in names:
        summary[n] = {"predicted_s": sum(r[n]["predicted_s"] for r in rows), "cpu_s": sum(r[n]["cpu_s"] for r in rows),
                      "worse_than_unbounded": sum(r[n]["predicted_s"] > 1.001 * r["unbounded"]["predicted_s"]
                                                  for r in rows)}
        s = summary[n]
        print(f"{n:12s}: predicted {s['predicted_s']:.3f} s, planning {s['cpu_s']:.1f} CPU s, "
              f"worse than unbounded in {s['worse_than_unbounded']} of {len(rows)}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"studies": args.studies, "micro_batches": args.micro_batches, "summary": summary, "rows": rows},
                  f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
