"""Which of a wrong profile's terms makes Zeppelin lose: one robustness run replanned with each factor alone.

The robustness study (docs/results.md) plans every strategy with a profile whose attention rates,
GEMM rate, NVLink and NIC bandwidth are each off by a seeded factor (sim/perturb.py) and simulates
the plans with the true profile; the report names the losses and the term of the simulated
iteration that moved most. This replans Zeppelin on one such run with the true profile, with every
factor (the run as the study made it: its stored iteration is checked), and with each factor alone
(``perturbed(..., only=(term,))``), every plan simulated with the true profile, beside the run's
best deployed baseline: the factor whose plan alone loses is the one the loss comes from.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_robustness_terms.py --study results/bench/robustness.json \\
        --label "a800 llama-7b github 64K 2n 16K/GPU err0.25~1" --out results/s56/robustness_terms.json

Every number is simulated (deterministic): rerunning gives the same.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_zeppelin.sim import runs  # noqa: E402
from megatron_zeppelin.sim.perturb import TERMS, factors, perturbed  # noqa: E402
from megatron_zeppelin.sim.stored import recorded_setup, stored_runs  # noqa: E402


def zeppelin_mean(spec, profile, plan_profile, model, topo, config) -> dict:
    """Zeppelin's mean simulated iteration over the run, planned with ``plan_profile``, simulated
    with ``profile`` (as sim/runs.py run_config does), and which candidates won."""
    times, won = [], []
    for steps in runs.run_steps(spec, topo.world_size):
        plans = [runs.make_plan("zeppelin", lengths, topo, plan_profile, model, config, runs.AUTO) for lengths in steps]
        _, res = runs._simulate_steps("zeppelin", steps, plans, topo, profile, model, config, runs.AUTO, spec.tp,
                                      None, spec.pipeline)
        times.append(res.iteration_s)
        won += [p.meta.variant for p in plans]
    return {"iteration_s": sum(times) / len(times), "batch_iteration_s": times, "won": won}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", required=True, help="the robustness study's file of `zeppelin bench --out-dir`")
    ap.add_argument("--label", required=True, help="a perturbed run's label, as docs/results.md prints it")
    ap.add_argument("--out", required=True, help="JSON to write (under results/)")
    args = ap.parse_args()
    spec, rec = stored_runs(args.study, label=args.label)[0]
    if not spec.profile_error:
        raise SystemExit(f"{args.label}: not a perturbed run (its profile_error is 0)")
    profile, model, topo, config = recorded_setup(spec, rec)
    with open(args.study) as f:
        others = [r for r in json.load(f)["runs"] if r["key"] == rec["key"] and r["variant"] in runs.STRATEGIES
                  and r["variant"] != "zeppelin" and r.get("iteration_s") and not r.get("error")]
    best = min(others, key=lambda r: r["iteration_s"]) if others else None
    out = {"label": args.label, "study": args.study, "factors": factors(spec.profile_error, spec.profile_seed),
           "stored_iteration_s": rec["iteration_s"],
           "best_deployed_baseline": {"variant": best["variant"], "iteration_s": best["iteration_s"]} if best else None,
           "planned_with": {}}
    cases = [("true profile", ())] + [(t, (t,)) for t in TERMS] + [("every factor", TERMS)]
    for name, only in cases:
        plan_profile = perturbed(profile, spec.profile_error, spec.profile_seed, only=only) if only else profile
        row = zeppelin_mean(spec, profile, plan_profile, model, topo, config)
        if best:
            row["speedup_over_best"] = best["iteration_s"] / row["iteration_s"]
        out["planned_with"][name] = row
        print(f"{name:14s} iteration {row['iteration_s']:.4f} s"
              + (f", speedup over {best['variant']} {row['speedup_over_best']:.3f}x" if best else ""), flush=True)
    whole = out["planned_with"]["every factor"]["iteration_s"]
    out["reproduces_stored"] = abs(whole - rec["iteration_s"]) <= 1e-9 * rec["iteration_s"]
    print(f"every factor reproduces the stored run ({rec['iteration_s']:.4f} s): {out['reproduces_stored']}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")
    return 0 if out["reproduces_stored"] else 1


if __name__ == "__main__":
    sys.exit(main())
