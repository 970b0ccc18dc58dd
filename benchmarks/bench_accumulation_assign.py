"""One iteration of a stored accumulation configuration, micro-batch by micro-batch: Zeppelin's plans
in data order, jointly assigned, grouped by length and packed in rounds (planner/accumulation.py;
``rounds_full``: the rounds each filled to the capacity, as ``rounds`` packed them before ``round_fill``;
``rounds_share``: the least fill from data order's per-rank share alone, as ``round_fill`` set it before
it kept the longest document inside a node; ``rounds_node``: the longest document kept inside a node
with pipeline stages too, where ``rounds`` does not), each micro-batch's simulated and predicted
seconds, its lower bound and its longest documents, beside dynamic_cp's rounds at its deployed
max_seqlen_per_dp_cp_rank (the whole global batch, as Megatron's scheduler); with pipeline stages also
each assignment's iteration in 1F1B (``pipelined_s``), which reads how even the micro-batches are.
What docs/results.md reports as one mean per run, taken apart to see where the time goes.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_accumulation_assign.py \\
        --study results/bench/accumulation.json --label "a800 llama-7b github 64K 4n mem gbs 1M x9" \\
        --out results/s53/assign_a800_7b_github.json
    PYTHONPATH=. .venv/bin/python benchmarks/bench_accumulation_assign.py --only rounds rounds_full \\
        --study results/bench/accumulation.json --label "h200 llama3-8b github 64K 4n mem gbs 1M x4" \\
        --out results/s54/fill_h200_llama3-8b_github.json
    PYTHONPATH=. .venv/bin/python benchmarks/bench_accumulation_assign.py --only rounds rounds_share \\
        rounds_node --study results/bench/pipeline.json --label "h200 llama3-70b tp8 prolong64k 64K 16n pp8 16K/GPU gbs 1M x32" \\
        --out results/s59/fill_pipeline_pp8_prolong64k.json

Every number is simulated (deterministic): rerunning gives the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_zeppelin.planner import make_context  # noqa: E402
from megatron_zeppelin.planner.accumulation import joint_indices, joint_steps  # noqa: E402
from megatron_zeppelin.sim import runs  # noqa: E402
from megatron_zeppelin.sim.iteration import SimOptions, pipeline, simulate  # noqa: E402
from megatron_zeppelin.sim.stored import recorded_setup, stored_runs  # noqa: E402
from megatron_zeppelin.spec.words import Accumulation  # noqa: E402


def _micro_batches(steps, topo, profile, model, config, tp, results=None):
    quiet = dataclasses.replace(SimOptions(), allreduce=False)  # the reduce once per iteration, not here
    out = []
    for lengths in steps:
        plan = runs.make_plan("zeppelin", lengths, topo, profile, model, config, runs.AUTO)
        res = simulate(plan, profile, model, tp=tp, options=quiet)
        if results is not None:
            results.append(res)
        out.append({"tokens": sum(lengths), "documents": len(lengths), "longest": sorted(lengths, reverse=True)[:6],
                    "simulated_s": res.iteration_s, "predicted_s": max(c.total_s for c in plan.cost),
                    "lower_bound_s": plan.lower_bound_s, "won": plan.meta.variant})
    return out


def _rounds_full(steps, topo, profile, model, config):
    """(micro-batches, config) of rounds each filled to the capacity they are planned with."""
    c = joint_steps(steps, topo, profile, model, config, Accumulation.ROUNDS)[1]
    ctx = make_context(topo, profile, model, c)
    docs = [L for s in steps for L in s]
    idx = joint_indices(steps, ctx.cost, ctx.capacity, topo.world_size, Accumulation.ROUNDS, (ctx.capacity,) * 2)
    return [[docs[i] for i in m] for m in idx], c


def _rounds_at(node: bool):
    """(micro-batches, config) of rounds whose least fill is data order's per-rank share alone, or
    (``node``) raised to keep the longest document in a node whatever the pipeline stages."""
    def rounds(steps, topo, profile, model, config):
        from megatron_zeppelin.planner.accumulation import round_fill
        c = joint_steps(steps, topo, profile, model, config, Accumulation.ROUNDS)[1]
        ctx = make_context(topo, profile, model, c)
        docs = [L for s in steps for L in s]
        fill = round_fill(steps, topo.world_size, ctx.capacity, topo.gpus_per_node if node else 0)
        idx = joint_indices(steps, ctx.cost, ctx.capacity, topo.world_size, Accumulation.ROUNDS, fill)
        return [[docs[i] for i in m] for m in idx], c
    return rounds


ASSIGNMENTS = ("data_order", "joint", "by_length", "rounds", "rounds_full", "rounds_share", "rounds_node")
OWN = {"rounds_full": _rounds_full, "rounds_share": _rounds_at(False), "rounds_node": _rounds_at(True)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", required=True, help="a study file of `zeppelin bench --out-dir`")
    ap.add_argument("--label", required=True, help="the configuration's label, as docs/results.md prints it")
    ap.add_argument("--batch", type=int, default=0, help="which iteration of the run")
    ap.add_argument("--out", required=True, help="JSON to write (under results/)")
    ap.add_argument("--only", nargs="+", choices=ASSIGNMENTS, default=ASSIGNMENTS,
                    help="the assignments to simulate (default all), dynamic_cp's rounds only with all")
    args = ap.parse_args()
    spec, rec = stored_runs(args.study, label=args.label)[0]
    profile, model, topo, config = recorded_setup(spec, rec)
    steps = runs.run_steps(spec, topo.world_size)[args.batch]
    out = {"label": args.label, "study": args.study, "batch": args.batch, "recompute": rec["recompute"],
           "capacity_tokens": config.capacity_tokens, "assignments": {}}
    for name, how in (("data_order", None), ("joint", Accumulation.JOINT), ("by_length", Accumulation.BY_LENGTH),
                      ("rounds", Accumulation.ROUNDS)) + tuple((n, None) for n in OWN):
        if name not in args.only:
            continue
        if name in OWN:
            s, c = OWN[name](steps, topo, profile, model, config)
        else:
            s, c = ((steps, config) if how is None else
                    joint_steps(steps, topo, profile, model, config, how, stages=spec.pipeline))
        results = []
        mbs = _micro_batches(s, topo, profile, model, c, spec.tp, results)
        out["assignments"][name] = {"simulated_s": sum(m["simulated_s"] for m in mbs), "micro_batches": mbs}
        piped = ""
        if spec.pipeline > 1:  # 1F1B over the stages: what uneven micro-batches cost there
            out["assignments"][name]["pipelined_s"] = pipeline(results, spec.pipeline).iteration_s
            piped = f", in 1F1B over {spec.pipeline} stages {out['assignments'][name]['pipelined_s']:.3f} s"
        print(f"{name:12s} {len(mbs)} micro-batches, simulated {out['assignments'][name]['simulated_s']:.3f} s "
              f"(lower bounds {sum(m['lower_bound_s'] for m in mbs):.3f} s){piped}: "
              + ", ".join(f"{m['simulated_s']:.2f}" for m in mbs))
    dc = (next((r for _, r in stored_runs(args.study, variant="dynamic_cp", label=args.label)), None)
          if set(args.only) == set(ASSIGNMENTS) else None)
    if dc and dc.get("run_setting"):
        dc_config = recorded_setup(spec, dc)[3]
        plans, rr = runs._global_batch_rounds(steps, topo, profile, model, dc_config, int(dc["run_setting"]),
                                              spec.tp, dataclasses.replace(SimOptions(), allreduce=False))
        out["dynamic_cp"] = {"max_seqlen_per_dp_cp_rank": int(dc["run_setting"]), "recompute": dc["recompute"],
                             "simulated_s": sum(r.iteration_s for r in rr.results),
                             "rounds": [{"tokens": sum(p.lengths), "documents": len(p.lengths),
                                         "longest": max(p.lengths), "simulated_s": r.iteration_s,
                                         "lower_bound_s": p.lower_bound_s} for p, r in zip(plans, rr.results)]}
        print(f"dynamic_cp {len(plans)} rounds at {dc['run_setting']} ({dc['recompute']}), simulated "
              f"{out['dynamic_cp']['simulated_s']:.3f} s: "
              + ", ".join(f"{r['tokens']}:{r['simulated_s']:.2f}" for r in out["dynamic_cp"]["rounds"]))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
