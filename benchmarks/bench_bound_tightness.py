"""How tight the fixed shapes' lower bounds are (portfolio/shapes.py ``candidate_placements``: the bound
that prunes a shape and, where the budget binds, orders nothing but decides whether it is weighed): the
first micro-batches of each configuration of the given study files, every fitting shape assembled with
remap off, its prediction over its bound, by shape family (median, least, most). Writes JSON:

    PYTHONPATH=. .venv/bin/python benchmarks/bench_bound_tightness.py --studies results/bench/accumulation.json \\
        --micro-batches 2 --out results/s51/bound_tightness.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics

import megatron_zeppelin.sim.runs as runs
from megatron_zeppelin.planner import make_context
from megatron_zeppelin.planner.build.assemble import assemble
from megatron_zeppelin.planner.portfolio.shapes import candidate_placements
from megatron_zeppelin.planner.types import PlanError
from megatron_zeppelin.sim.stored import recorded_setup, stored_runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--studies", nargs="+", required=True, help="study files, results/bench/<study>.json")
    ap.add_argument("--micro-batches", type=int, default=1)
    ap.add_argument("--out", required=True, help="JSON output (under results/)")
    args = ap.parse_args(argv)
    rows = []
    for path in args.studies:
        for spec, rec in stored_runs(path):
            if rec.get("error"):
                continue
            profile, model, topo, config = recorded_setup(spec, rec)
            steps = runs.run_steps(spec, topo.world_size)[0]
            for m in range(min(len(steps), args.micro_batches)):
                lengths = list(map(int, steps[m]))
                ctx = make_context(topo, profile, model, config, total_tokens=sum(lengths))
                for bound, label, pl in candidate_placements(lengths, ctx):
                    try:
                        predicted = assemble("zeppelin", lengths, ctx, pl).predicted_iteration_s
                    except PlanError:
                        continue
                    rows.append({"label": spec.label(), "micro_batch": m, "shape": label,
                                 "family": re.sub(r"\d+", "N", label), "bound_s": bound, "predicted_s": predicted})
            print(f"{spec.label()}: {len(rows)} shapes so far", flush=True)
    families = {}
    for f in sorted({r["family"] for r in rows}):
        ratios = sorted(r["predicted_s"] / r["bound_s"] for r in rows if r["family"] == f)
        families[f] = {"shapes": len(ratios), "median": statistics.median(ratios), "least": ratios[0], "most": ratios[-1]}
        print(f"{f:24s} {len(ratios):4d} shapes: predicted / bound median {families[f]['median']:.2f}, "
              f"least {ratios[0]:.2f}, most {ratios[-1]:.2f}")
    above = sum(r["bound_s"] > r["predicted_s"] for r in rows)
    print(f"bounds above their prediction: {above} of {len(rows)}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"studies": args.studies, "families": families, "bounds_above_prediction": above, "rows": rows},
                  f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
