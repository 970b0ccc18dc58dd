"""Why dynamic_cp beats Zeppelin under gradient accumulation: the same global batches, four ways.

The `accumulation` study gives every strategy the same global batch; Zeppelin plans its k data-order
micro-batches one by one (each ``tokens_per_gpu`` x ranks tokens, at the fastest recompute rung that
holds them), while dynamic_cp, as Megatron's scheduler does, pools the whole global batch and packs it
into HDP rounds of up to ``max_seqlen_per_dp_cp_rank`` (m) tokens a rank, at its own recompute rung
(sim/runs.py ``_global_batch_rounds``). Per configuration this prints and writes, all simulated in this
one run (sim/runs.py ``run_config``, the study's own call, for the first two):

- ``dynamic_cp``: deployed (its m and recompute fixed for the run);
- ``zeppelin``: data order, as the study runs it;
- ``zeppelin on dynamic_cp's rounds``: Zeppelin planning each of dynamic_cp's rounds (its documents,
  at its deployed m's recompute rung and that rung's capacity), the rounds accumulated as the study
  accumulates micro-batches (the reduce once). What joint planning over the global batch gives when
  the round composition is Megatron's: a Zeppelin with a variable micro-batch count per iteration,
  which the plugin does not run today (its micro-batch count is Megatron's, fixed per run);
- ``zeppelin, larger micro-batches``: the global batch cut into micro-batches of ``--fill`` x a
  rung's capacity x ranks tokens (fewer of them), at each rung of the recompute ladder, in data order
  and grouped (longest first into the first micro-batch with room, as dynamic_cp's rounds group
  long documents): what a user choosing a larger ``--micro-batch-size`` with more recompute would
  get (a count fixed per run; the grouped assignment is a ``--zeppelin-accumulation`` policy the
  plugin does not have yet: today's ``joint`` spreads long documents instead).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_accumulation_rounds.py --out results/rounds/rounds.json

Reads the configurations' specs from results/bench/accumulation.json (``--study``); ``--configs``
names them as cluster/model/dataset (the 1M-token global batches).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from megatron_zeppelin.sim import runs
from megatron_zeppelin.sim.iteration import SimOptions, accumulate, simulate
from megatron_zeppelin.sim.stored import stored_runs

DEFAULT_CONFIGS = ("a800/llama-7b/prolong64k", "a800/llama-7b/github", "h200/llama-7b/arxiv")


def _spec(study: str, key: str, gbs: int) -> runs.RunSpec:
    cluster, model, dataset = key.split("/")
    return stored_runs(study, cluster=cluster, model=model, dataset=dataset, global_batch_tokens=gbs)[0][0]


def _context(spec: runs.RunSpec):
    from megatron_zeppelin.spec.config import ZeppelinConfig
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.spec.model import load_model
    profile, model = load_profile(spec.cluster), load_model(spec.model)
    topo = runs.domain_topology(profile, spec.domain_nodes, spec.tp)
    config = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                            gpu_nic_map=topo.gpu_to_nic, cluster=spec.cluster, tp=spec.tp)
    return profile, model, topo, config


def _zeppelin_steps(steps_per_batch, spec, rc: str, cap: int):
    """Zeppelin over the given micro-batches of each batch at recompute ``rc`` and capacity ``cap``:
    (mean iteration seconds, micro-batches per batch, which candidates won)."""
    profile, model, topo, config = _context(spec)
    cfg = config.with_(recompute=rc, capacity_tokens=cap)
    times, counts, won = [], [], {}
    for steps in steps_per_batch:
        results = []
        for k, lengths in enumerate(steps):
            plan = runs.make_plan("zeppelin", lengths, topo, profile, model, cfg)
            opts = SimOptions() if k == len(steps) - 1 else SimOptions(allreduce=False)
            results.append(simulate(plan, profile, model, tp=spec.tp, options=opts))
            v = plan.meta.variant.split("/")[0]
            won[v] = won.get(v, 0) + 1
        times.append(accumulate(results).iteration_s)
        counts.append(len(steps))
    return sum(times) / len(times), counts, won


def _rounds_of(spec, mslpr: int, rc: str, cap: int):
    """dynamic_cp's rounds of each batch (their documents' lengths), as _global_batch_rounds packs them."""
    from megatron_zeppelin.planner import make_context
    from megatron_zeppelin.planner.baselines.dynamic_cp import round_placements
    profile, model, topo, config = _context(spec)
    cfg = config.with_(recompute=rc, capacity_tokens=cap)
    out = []
    for steps in runs.run_steps(spec, topo.world_size):
        pooled = [int(L) for s in steps for L in s]
        ctx = make_context(topo, profile, model, cfg, total_tokens=max(sum(int(L) for L in s) for s in steps))
        out.append([[pooled[i] for i in docs] for docs, _ in round_placements(pooled, ctx, mslpr)])
    return out


def _recut(spec, world: int, cap: int, fill: float, grouped: bool = False):
    """Each batch's documents cut into micro-batches of at most fill x cap x world tokens: in data
    order, or ``grouped``: longest first, each into the first micro-batch with room (first-fit
    decreasing: long documents share micro-batches, as dynamic_cp's rounds group them)."""
    out = []
    for steps in runs.run_steps(spec, world):
        room = int(cap * world * fill)
        docs = [int(x) for s in steps for x in s]
        if grouped:
            mbs, tok = [], []
            for L in sorted(docs, reverse=True):
                j = next((j for j, t in enumerate(tok) if t + L <= room), None)
                if j is None:
                    mbs.append([])
                    tok.append(0)
                    j = len(mbs) - 1
                mbs[j].append(L)
                tok[j] += L
            out.append(mbs)
            continue
        mbs, cur, tok = [], [], 0
        for L in docs:
            if cur and tok + L > room:
                mbs.append(cur)
                cur, tok = [], 0
            cur.append(L)
            tok += L
        out.append(mbs + [cur])
    return out


def measure(spec: runs.RunSpec, fill: float) -> dict:
    t0 = time.time()
    row = {"label": spec.label(), "tokens_per_gpu": spec.tokens_per_gpu, "micro_batches": spec.micro_batches}
    for rec in runs.run_config(spec, ["dynamic_cp", "zeppelin"]):
        row[rec["variant"]] = {"iteration_s": rec["iteration_s"], "recompute": rec["recompute"],
                               "setting": rec.get("run_setting", ""), "won": rec.get("won", {})}
    d = row["dynamic_cp"]
    rungs = dict(runs.recompute_rungs(spec))
    mslpr, rc = int(d["setting"]), d["recompute"]
    t, counts, won = _zeppelin_steps(_rounds_of(spec, mslpr, rc, rungs[rc]), spec, rc, rungs[rc])
    row["zeppelin_on_dynamic_cp_rounds"] = {"iteration_s": t, "recompute": rc, "mslpr": mslpr,
                                            "rounds": counts, "won": won}
    world = _context(spec)[2].world_size
    row["zeppelin_larger_micro_batches"] = []
    for rc, cap in rungs.items():
        for grouped in (False, True):
            try:
                t, counts, won = _zeppelin_steps(_recut(spec, world, cap, fill, grouped), spec, rc, cap)
            except runs.ZeppelinError as e:
                t, counts, won = None, [], {"error": str(e)[:200]}
            row["zeppelin_larger_micro_batches"].append({"recompute": rc, "capacity": cap, "fill": fill,
                                                         "grouped": grouped, "iteration_s": t,
                                                         "micro_batches": counts, "won": won})
    row["wall_s"] = time.time() - t0
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON output (under results/)")
    ap.add_argument("--study", default="results/bench/accumulation.json")
    ap.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), metavar="CLUSTER/MODEL/DATASET")
    ap.add_argument("--global-batch-tokens", type=int, default=1 << 20)
    ap.add_argument("--fill", type=float, default=0.9, help="larger micro-batches: share of a rung's capacity")
    args = ap.parse_args(argv)
    rows = []
    for i, key in enumerate(args.configs):
        row = measure(_spec(args.study, key, args.global_batch_tokens), args.fill)
        rows.append(row)
        best = min((x for x in row["zeppelin_larger_micro_batches"] if x["iteration_s"] is not None),
                   key=lambda x: x["iteration_s"], default=None)
        print(f"[{i + 1}/{len(args.configs)}] {row['label']}: dynamic_cp {row['dynamic_cp']['iteration_s']:.3f} s "
              f"(m {row['dynamic_cp']['setting']}, rc={row['dynamic_cp']['recompute']}); "
              f"zeppelin {row['zeppelin']['iteration_s']:.3f} s; on dynamic_cp's rounds "
              f"{row['zeppelin_on_dynamic_cp_rounds']['iteration_s']:.3f} s; larger micro-batches best "
              + (f"{best['iteration_s']:.3f} s (rc={best['recompute']}, {best['micro_batches']}"
                 f"{', grouped' if best['grouped'] else ''})" if best else "-")
              + f" [{row['wall_s']:.0f} s]", flush=True)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"command": "benchmarks/bench_accumulation_rounds.py " + " ".join(sys.argv[1:] if argv is None else argv), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
