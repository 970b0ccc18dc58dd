"""Same plans, same predictions, same simulations: a change meant to make planning faster without
changing any result (e.g. the prediction of routed placements) must print ``identical`` here.

Each case is computed by a tree of megatron_zeppelin in its own process (``--emit``, with that tree
on PYTHONPATH) and the two trees' records are compared exactly: Plan digests (planner/plan_digest.py),
``predicted_iteration_s`` as its float's repr, and ``zeppelin simulate``'s whole JSON (simulated
times, per-rank compute, link bytes, timeline). Cases:

- ``accumulation``: the first micro-batches of the accumulation study's worst configuration (a800,
  llama-7b, prolong64k, 1M tokens over 32 ranks, as results/bench/accumulation.json stores it), each
  planned as the run plans it, and again with an unlimited search (``plan_budget_ms`` 0);
- ``latency``: bench_planner.py's LATENCY_CASES batches (1k / 64, 16k / 1024, 100 / 64) under every
  strategy whose planning reads the prediction;
- ``run``: bench_planner.py's RUN_CASES, the first 3 batches of each, one Planner per run;
- ``simulate``: a few ``zeppelin simulate`` runs (routed and unrouted, chunked and unchunked relays).

    git archive main megatron_zeppelin | tar -x -C results/fastpredict/base
    PYTHONPATH=. .venv/bin/python benchmarks/plan_identity.py --compare-src results/fastpredict/base \
        --time 5 --out results/fastpredict/identity.json

``--time N`` also reports each tree's least CPU time of N plans of the three unbounded accumulation
batches (each tree in its own process, one after the other: a shared host's load moves both).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # bench_planner's cases

ACCUMULATION = ("zeppelin", "a800", "llama-7b", "prolong64k", 1 << 20)  # (variant, cluster, model, dataset, tokens)
ACCUMULATION_PLANS = 6  # make_plan calls recorded (the run's first micro-batches)
TIME_REPEATS = 0  # --time N: the unbounded accumulation plans' least CPU ms of N (set in the child)
LATENCY_STRATEGIES = ("zeppelin", "static_cp", "allgather_cp", "hybrid_dp", "dynamic_cp", "packed_dp")
SIMULATE = (
    ["--cluster", "a800", "--model", "llama-7b", "--nodes", "4", "--dataset", "prolong64k",
     "--global-batch-tokens", "1048576"],
    ["--cluster", "a800", "--model", "llama-7b", "--nodes", "4", "--dataset", "prolong64k",
     "--global-batch-tokens", "1048576", "--relay-chunk-bytes", "0"],
    ["--cluster", "a800", "--model", "llama-7b", "--nodes", "4", "--dataset", "prolong64k",
     "--global-batch-tokens", "1048576", "--routing", "off"],
    ["--cluster", "h200", "--model", "llama-13b", "--tp", "2", "--nodes", "4", "--dataset", "arxiv",
     "--global-batch-tokens", "524288", "--seed", "3"],
    ["--cluster", "a800", "--model", "llama-7b", "--nodes", "4", "--dataset", "prolong64k",
     "--global-batch-tokens", "1048576", "--strategy", "static_cp+routing"],
    ["--cluster", "h800", "--model", "llama-13b", "--tp", "2", "--nodes", "2", "--dataset", "github",
     "--global-batch-tokens", "262144", "--seed", "1"],
)


def _record(plan) -> dict:
    from megatron_zeppelin.planner.plan_digest import plan_digest
    return {"digest": plan_digest(plan),
            "predicted_iteration_s": repr(plan.predicted_iteration_s),
            "ops": len(plan.schedule)}


def accumulation_cases() -> dict:
    """The run's own make_plan calls (recorded as it makes them), then the first three batches with an
    unlimited search."""
    import megatron_zeppelin.sim.runs as runs
    from megatron_zeppelin.planner import plan_batch
    out, batches = {}, []
    orig = runs.make_plan

    class _Enough(Exception):
        pass

    def recording(variant, lengths, topo, profile, model, config, setting=None):
        plan = orig(variant, lengths, topo, profile, model, config, setting)
        out[f"accumulation/make_plan{len(batches)}/{variant}/{len(lengths)} docs"] = _record(plan)
        batches.append((list(lengths), topo, profile, model, config))
        if len(batches) >= ACCUMULATION_PLANS:
            raise _Enough
        return plan

    stored = json.load(open(os.path.join(HERE, "..", "results", "bench", "accumulation.json")))["runs"]
    fields = {f.name for f in dataclasses.fields(runs.RunSpec)}
    spec = next(runs.RunSpec(**{k: v for k, v in r.items() if k in fields}) for r in stored
                if (r["variant"], r["cluster"], r["model"], r["dataset"], r["global_batch_tokens"]) == ACCUMULATION)
    runs.make_plan = recording
    try:
        runs.run_config(spec, [ACCUMULATION[0]])
    except _Enough:
        pass
    finally:
        runs.make_plan = orig
    for k, (lengths, topo, profile, model, config) in enumerate(batches[:3]):
        plan = plan_batch(lengths, topo, profile, model, config.with_(plan_budget_ms=0), strategy="zeppelin")
        out[f"accumulation/unbounded{k}/{len(lengths)} docs"] = _record(plan)
        cpu = []
        for _ in range(TIME_REPEATS):  # its planning time (not compared: reported)
            c0 = time.process_time()
            plan_batch(lengths, topo, profile, model, config.with_(plan_budget_ms=0), strategy="zeppelin")
            cpu.append(time.process_time() - c0)
        if cpu:
            out[f"timing/accumulation/unbounded{k}/{len(lengths)} docs"] = 1e3 * min(cpu)
    return out


def latency_cases() -> dict:
    from bench_planner import LATENCY_CASES
    from megatron_zeppelin.planner import plan_batch
    from megatron_zeppelin.spec.config import ZeppelinConfig
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.spec.model import load_model
    from megatron_zeppelin.spec.topology import Topology
    prof, model = load_profile("a800"), load_model("llama-7b")
    out = {}
    for n, nodes in LATENCY_CASES:  # bench_planner.latency's batch
        lengths = np.random.default_rng(0).lognormal(7.5, 1.3, n).clip(1, 65536).astype(np.int64)
        topo = Topology(nodes, 8, prof.nics_per_node, prof.gpu_to_nic)
        for s in LATENCY_STRATEGIES:
            if n > 2000 and s != "zeppelin":  # the baselines at 1024 ranks add minutes, not coverage
                continue
            plan = plan_batch(lengths, topo, prof, model, ZeppelinConfig(gpus_per_node=8), strategy=s)
            out[f"latency/{n} docs/{nodes * 8} ranks/{s}"] = _record(plan)
    return out


def run_cases() -> dict:
    from bench_planner import RUN_CASES
    from megatron_zeppelin.planner import Planner
    from megatron_zeppelin.sim.matrix import batch_and_recompute
    from megatron_zeppelin.sim.runs import RunSpec, domain_topology, run_lengths
    from megatron_zeppelin.spec.config import ZeppelinConfig
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.spec.model import load_model
    out = {}
    for case in RUN_CASES:  # as bench_planner.run_latency plans them
        cl, model_name, tp, dataset, context, nodes, per_gpu, recompute = case
        per_gpu, capacity, recompute = batch_and_recompute(cl, model_name, tp, nodes, per_gpu, recompute)
        prof, model = load_profile(cl), load_model(model_name)
        topo = domain_topology(prof, nodes)
        spec = RunSpec("latency", cl, model_name, tp, dataset, context, nodes, per_gpu, capacity=capacity,
                       batches=3, recompute=recompute)
        config = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                                gpu_nic_map=topo.gpu_to_nic, cluster=cl, recompute=recompute, tp=tp,
                                capacity_tokens=capacity)
        planner = Planner(topo, prof, model, config)
        for k, b in enumerate(run_lengths(spec, topo.world_size)):
            out[f"run/{'/'.join(map(str, case))}/batch{k}"] = _record(planner.plan(b))
    return out


def simulate_cases() -> dict:
    from megatron_zeppelin.cli import main
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for k, argv in enumerate(SIMULATE):
            path = os.path.join(d, f"{k}.json")
            with contextlib.redirect_stdout(io.StringIO()):
                rc = main(["simulate", *argv, "--json", path])
            out["simulate/" + " ".join(argv)] = {"rc": rc, "json": json.load(open(path)) if rc == 0 else None}
    return out


def emit(groups) -> dict:
    out = {}
    for g in groups:
        t0 = time.process_time()
        out.update({"accumulation": accumulation_cases, "latency": latency_cases, "run": run_cases,
                    "simulate": simulate_cases}[g]())
        print(f"{g}: {time.process_time() - t0:.1f} s CPU", file=sys.stderr, flush=True)
    return out


def _tree_records(tree: str, groups, repeats: int = 0) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--time", str(repeats), "--emit", *groups], env=env,
                       stdout=subprocess.PIPE, check=True, text=True, timeout=3600)
    rec = json.loads(r.stdout)
    assert rec.pop("package") == os.path.join(os.path.abspath(tree), "megatron_zeppelin"), "wrong tree imported"
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare-src", help="the other tree (its megatron_zeppelin/ is imported)")
    ap.add_argument("--groups", nargs="+", default=["accumulation", "latency", "run", "simulate"])
    ap.add_argument("--emit", nargs="+", help=argparse.SUPPRESS)  # a child: records of this tree, JSON on stdout
    ap.add_argument("--time", type=int, default=0, metavar="N",
                    help="also time the unbounded accumulation plans: least CPU ms of N per tree (not compared)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    global TIME_REPEATS
    TIME_REPEATS = args.time
    if args.emit:
        import megatron_zeppelin
        rec = emit(args.emit)
        rec["package"] = os.path.dirname(os.path.abspath(megatron_zeppelin.__file__))
        print(json.dumps(rec, sort_keys=True))
        return 0
    if not args.compare_src:
        ap.error("--compare-src DIR is needed")
    here = os.path.abspath(os.path.join(HERE, ".."))
    old, new = _tree_records(args.compare_src, args.groups, args.time), _tree_records(here, args.groups, args.time)
    timing = []
    for key in sorted(k for k in old if k.startswith("timing/")):
        o, n = old.pop(key), new.pop(key, None)
        timing.append({"case": key[len("timing/"):], "old_cpu_ms": o, "new_cpu_ms": n, "old_over_new": o / n})
        print(f"CPU {key[len('timing/'):]}: old {o:.0f} ms, new {n:.0f} ms, {o / n:.2f}x")
    rows, same = [], True
    for key in sorted(set(old) | set(new)):
        ok = old.get(key) == new.get(key)
        same &= ok
        o = old.get(key, {})
        show = o.get("digest") or (o.get("json") or {}).get("plan_digest", "")
        pred = o.get("predicted_iteration_s") or repr((o.get("json") or {}).get("iteration_s"))
        rows.append({"case": key, "identical": ok, "digest": show, "value": pred})
        print(f"{'identical' if ok else 'DIFFERENT'}  {key}  {str(show)[:16]}  {pred}")
    print(f"{sum(r['identical'] for r in rows)} of {len(rows)} cases identical")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"old": os.path.abspath(args.compare_src), "new": here, "identical": same, "cases": rows,
                       "timing": timing, "load_average": os.getloadavg()[0]}, f, indent=1)
        print(f"wrote {args.out}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
