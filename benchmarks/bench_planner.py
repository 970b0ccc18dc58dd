"""Planner benchmark: latency of the whole ``plan_batch`` (partition, assembly, remap, routed
schedule, prediction) and the quality of Zeppelin's plans on the paper's workloads. Writes JSON.

Latency cases (issue 2): 1k documents for 64 ranks (8 nodes x 8) and 16k documents for 1024 ranks
(128 nodes x 8), and a small batch of 100 documents for 64 ranks; a800 profile, llama-7b; lengths
lognormal (median e^7.5 ~ 1.8k tokens, sigma 1.3, seed 0) clipped to [1, 64K]. Median (and min) of
``--repeats`` runs after one warm-up, of ``plan_batch`` (everything built per call) and of one
``Planner`` planning the batch again and again (a run's steady state: its cost model and crossover
lengths built once; wall and CPU medians, the CPU one the issue's goals are stated in).

Run cases (``RUN_CASES``): the matrix's own runs (sim/runs.py's RunSpec, its first 3 batches), at
16K tokens per GPU with the activation recompute a user would run there, or memory-bound (the batch
each GPU's memory allows, sim/matrix.py), planned by one Planner per run as the Megatron-LM forward
step holds it: tens to hundreds of long documents on 32 GPUs, where the search also weighs the
baselines' fixed shapes (candidates.py). Median over the batches and repeats, beside each batch's
predicted iteration (with the DP all-reduce): the forward step plans before every forward, so the
planning time adds to the iteration.

Quality: arxiv, github and prolong64k (workloads.sample_batch, 64K context, ~1M tokens, seeds
``--seeds``) at 4 nodes x 8 A800, llama-7b, every strategy: predicted iteration, imbalance
(max/mean per-rank time) and the ratio to the lower bound.

Sweep (``--sweep``): Zeppelin against every baseline on the paper's other settings: clusters a800
and h200, 2..16 nodes of 8 GPUs, 64K..256K context, 256K tokens per node per global batch, seed 0.

Scale (``--scale``): 1k documents / 64 ranks, 16k / 1024 and 128k / 8192 (1024 nodes x 8), documents
drawn from the prolong64k and arxiv mixes (seed 0, cut at 64K), each case in a fresh process: one
Planner's first plan (it builds the run's cost model) and its second (steady), wall and CPU seconds, and the
process's peak resident memory (``ru_maxrss``) before and after; then the slope of the steady time
over documents, log(t2 / t1) / log(n2 / n1), of wall and of CPU time (1: linear; n log n over 16k -> 128k
is about 1.2).

``--balance-memory``: every plan with ``--zeppelin-balance-memory`` (docs/partitioner.md: memory balance).

Against older code (``--compare-src DIR``: a tree holding another version of the
``megatron_zeppelin`` package, e.g. ``git archive <commit> megatron_zeppelin | tar -x -C DIR``; a tree from before
the modules moved into packages (the presets under configs/) has other module names and cannot be compared):
each latency case runs in fresh processes, alternately this tree's planner and DIR's, ``--rounds``
times, and the ratio old / new of their median CPU and wall times is reported, and of the least time
over all processes (``ratio_min``: on a shared host whole processes run slow, so the medians of a few
rounds can flip); on a loaded machine the ratio measured in the same run is the number to trust.

    .venv/bin/python benchmarks/bench_planner.py --out out/bench_planner.json
    .venv/bin/python benchmarks/bench_planner.py --skip-latency --skip-quality --sweep --out out/sweep.json
    .venv/bin/python benchmarks/bench_planner.py --skip-quality --compare-src /tmp/old --out out/latency_vs_old.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from megatron_zeppelin.spec.config import STRATEGIES
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner import plan_batch
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.topology import Topology


# (documents, nodes of 8): the two cases, and a small batch (1.6 documents per rank), where the
# search also weighs the baselines' fixed shapes (candidates.py), each a ring schedule to prepare.
LATENCY_CASES = ((1000, 8), (16000, 128), (100, 8))
# (cluster, model, TP, dataset, context, nodes of 8, tokens per GPU or "memory", recompute): runs of the matrix
# ("auto": the fastest recompute whose capacity holds the batch, which then binds, as the matrix runs it)
RUN_CASES = (("a800", "llama-7b", 1, "prolong64k", 65536, 4, 16384, "auto"),
             ("h200", "llama-13b", 2, "arxiv", 65536, 4, 16384, "auto"),
             ("h200", "llama-30b", 4, "github", 16384, 4, 16384, "auto"),
             ("h800", "llama-13b", 2, "github", 65536, 4, "memory", "none"),
             ("h200", "llama-7b", 1, "github", 16384, 4, "memory", "none"))


SCALE_CASES = ((1000, 8), (16000, 128), (128000, 1024))  # (documents, nodes of 8): 16 documents a rank
SCALE_MIXES = ("prolong64k", "arxiv")

BALANCE_MEMORY = False  # --balance-memory: every plan with --zeppelin-balance-memory


def _config(**kw):
    """The planner's config of a case (with --zeppelin-balance-memory under --balance-memory)."""
    from megatron_zeppelin.spec.config import ZeppelinConfig
    return ZeppelinConfig(**kw, **({"balance_memory": True} if BALANCE_MEMORY else {}))


def latency(n_docs: int, nodes: int, repeats: int, strategy: str, prof, model) -> dict:
    """Wall-clock (the target) and CPU time of plan_batch; the CPU time shows what the planner
    costs when other processes share the machine's cores."""
    rng = np.random.default_rng(0)
    lengths = rng.lognormal(7.5, 1.3, n_docs).clip(1, 65536).astype(np.int64)
    topo = Topology(nodes, 8, prof.nics_per_node, prof.gpu_to_nic)
    config = _config(gpus_per_node=8)
    plan_batch(lengths, topo, prof, model, config, strategy=strategy)  # warm-up (imports, caches)
    times, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        plan = plan_batch(lengths, topo, prof, model, config, strategy=strategy)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    out = {"strategy": strategy, "docs": n_docs, "ranks": topo.world_size, "tokens": int(lengths.sum()),
           "median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times), "repeats": repeats,
           "cpu_median_ms": 1e3 * statistics.median(cpu), "load_average": os.getloadavg()[0],
           "classes": plan.class_counts(), "ops": len(plan.schedule), "moves": len(plan.remap)}
    try:  # a run's steady state: one Planner for every batch (older trees have plan_batch only)
        from megatron_zeppelin.planner import Planner
    except ImportError:
        return out
    planner = Planner(topo, prof, model, config)
    planner.plan(lengths, strategy)  # the run's first batch builds what the run shares
    steady, steady_cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        planner.plan(lengths, strategy)
        steady.append(time.perf_counter() - t0)
        steady_cpu.append(time.process_time() - c0)
    out.update(planner_median_ms=1e3 * statistics.median(steady), planner_min_ms=1e3 * min(steady),
               planner_cpu_median_ms=1e3 * statistics.median(steady_cpu))
    return out


def run_latency(case: int, repeats: int) -> dict:
    """Zeppelin on the first 3 batches of run ``RUN_CASES[case]``, one Planner for the run (its first
    plan of each batch is a warm-up): wall and CPU time per plan, median over batches and repeats."""
    from megatron_zeppelin.planner import Planner
    from megatron_zeppelin.sim.matrix import batch_and_recompute
    from megatron_zeppelin.sim.runs import RunSpec, domain_topology, run_lengths
    cl, model_name, tp, dataset, context, nodes, per_gpu, recompute = RUN_CASES[case]
    per_gpu, capacity, recompute = batch_and_recompute(cl, model_name, tp, nodes, per_gpu, recompute)
    prof, model = load_profile(cl), load_model(model_name)
    topo = domain_topology(prof, nodes)
    spec = RunSpec("latency", cl, model_name, tp, dataset, context, nodes, per_gpu, capacity=capacity, batches=3,
                   recompute=recompute)
    config = _config(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                     gpu_nic_map=topo.gpu_to_nic, cluster=cl, recompute=recompute, tp=tp, capacity_tokens=capacity)
    planner, batches = Planner(topo, prof, model, config), run_lengths(spec, topo.world_size)
    iteration = [planner.plan(b).predicted_with_allreduce_s for b in batches]
    times, cpu = [], []
    for _ in range(repeats):
        for b in batches:
            t0, c0 = time.perf_counter(), time.process_time()
            planner.plan(b)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return {"run": "/".join(map(str, RUN_CASES[case])), "docs": [len(b) for b in batches], "ranks": topo.world_size,
            "median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times), "repeats": repeats,
            "cpu_median_ms": 1e3 * statistics.median(cpu), "load_average": os.getloadavg()[0],
            "batch_ms": [1e3 * statistics.median(times[k::len(batches)]) for k in range(len(batches))],
            "predicted_iteration_s": iteration}


def scale_case(mix: str, n_docs: int, nodes: int, prof, model) -> dict:
    """One scale case in this process (run it in a fresh one: the peak memory is the process's)."""
    import resource

    from megatron_zeppelin.data.workloads import cut_to_context, load_distribution
    from megatron_zeppelin.planner import Planner
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    lengths = cut_to_context(load_distribution(mix).draw(np.random.default_rng(0), n_docs), 65536).astype(np.int64)
    topo = Topology(nodes, 8, prof.nics_per_node, prof.gpu_to_nic)
    planner = Planner(topo, prof, model, _config(gpus_per_node=8))
    t0, c0 = time.perf_counter(), time.process_time()
    plan = planner.plan(lengths)
    first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
    classes = plan.class_counts()
    del plan
    t0, c0 = time.perf_counter(), time.process_time()
    planner.plan(lengths)
    steady, steady_cpu = time.perf_counter() - t0, time.process_time() - c0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"mix": mix, "docs": n_docs, "ranks": topo.world_size, "tokens": int(lengths.sum()),
            "first_s": first, "steady_s": steady, "first_cpu_s": first_cpu, "steady_cpu_s": steady_cpu,
            "peak_rss_mib": rss1 / 1024, "rss_before_mib": rss0 / 1024,
            "classes": classes, "load_average": os.getloadavg()[0]}


def scale(args) -> list:
    """Every scale case in a fresh process, and the slope of the steady time over documents."""
    out = []
    for mix in SCALE_MIXES:
        rows = []
        for n, nodes in SCALE_CASES:
            cmd = [sys.executable, os.path.abspath(__file__), "--one-scale", mix, str(n), str(nodes),
                   "--cluster", args.cluster, "--model", args.model]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=3600)
            r = json.loads(done.stdout.strip().splitlines()[-1])
            if rows:
                prev = rows[-1]
                r["slope_from_previous"] = (np.log(r["steady_s"] / prev["steady_s"]) /
                                            np.log(r["docs"] / prev["docs"]))
                if "steady_cpu_s" in prev:  # CPU seconds: the slope a loaded host cannot bend
                    r["cpu_slope_from_previous"] = (np.log(r["steady_cpu_s"] / prev["steady_cpu_s"]) /
                                                    np.log(r["docs"] / prev["docs"]))
            rows.append(r)
            print(f"scale {mix:10s} {n:6d} docs {r['ranks']:5d} ranks: first {r['first_s']:.2f} s, steady "
                  f"{r['steady_s']:.2f} s (CPU {r['steady_cpu_s']:.2f}), peak RSS {r['peak_rss_mib']:.0f} MiB (before {r['rss_before_mib']:.0f})"
                  + (f", slope {r['slope_from_previous']:.2f} (CPU {r['cpu_slope_from_previous']:.2f})"
                     if "slope_from_previous" in r else "")
                  + f" (load {r['load_average']:.1f})", flush=True)
        out += rows
    return out


def compare(case: list, info: dict, repeats: int, rounds: int, old_src: str, args) -> dict:
    """Latency of this tree's planner and of ``old_src``'s in alternating fresh processes (zeppelin);
    ``case``: the child's arguments (``--one-case DOCS NODES`` or ``--one-run K``)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs = {"old": [], "new": []}
    for _ in range(rounds):
        for which, src in (("old", old_src), ("new", here)):
            env = dict(os.environ, PYTHONPATH=src)
            cmd = [sys.executable, os.path.abspath(__file__), *case,
                   "--repeats", str(repeats), "--cluster", args.cluster, "--model", args.model]
            out = subprocess.run(cmd, env=env, cwd=src, capture_output=True, text=True, check=True, timeout=1800)
            runs[which].append(json.loads(out.stdout.strip().splitlines()[-1]))
    res = dict(info, rounds=rounds, repeats=repeats, old_src=old_src)
    for which, rs in runs.items():
        for key in ("median_ms", "cpu_median_ms"):
            res[f"{which}_{key}"] = statistics.median(r[key] for r in rs)
        # Whole processes run slow on a shared host (the same code 8.5 or 14 ms per process, for all of
        # its repeats): the least over the processes is the figure such a mode cannot move.
        res[f"{which}_min_ms"] = min(r["min_ms"] for r in rs)
        res[f"{which}_process_medians_ms"] = [round(r["median_ms"], 3) for r in rs]
        if all("planner_median_ms" in r for r in rs):  # a Planner reused over the run's batches
            res[f"{which}_planner_median_ms"] = statistics.median(r["planner_median_ms"] for r in rs)
            res[f"{which}_planner_min_ms"] = min(r["planner_min_ms"] for r in rs)
            if all("planner_cpu_median_ms" in r for r in rs):  # the goals' figure (older trees: not measured)
                res[f"{which}_planner_cpu_median_ms"] = statistics.median(r["planner_cpu_median_ms"] for r in rs)
        res[f"{which}_package"] = rs[0]["package"]
    res["ratio_wall"] = res["old_median_ms"] / res["new_median_ms"]
    res["ratio_cpu"] = res["old_cpu_median_ms"] / res["new_cpu_median_ms"]
    res["ratio_min"] = res["old_min_ms"] / res["new_min_ms"]
    res["load_average"] = os.getloadavg()[0]
    return res


def budget_rate(repeats: int, prof, model) -> dict:
    """The planning rate of spec/config.PLAN_RATE_UNITS_PER_S: Zeppelin's plans of the latency cases
    and the matrix's runs with no budget to cut (a huge --zeppelin-plan-budget-ms), each plan's work
    units (portfolio/budget.py: what its search charged, the partitioner's recorded units with them)
    over its CPU seconds; the rate is the median
    of the per-plan rates (units per second of this host's planner)."""
    from megatron_zeppelin.planner import Planner, strategies
    from megatron_zeppelin.planner.choice import SearchBudget
    from megatron_zeppelin.sim.matrix import batch_and_recompute
    from megatron_zeppelin.sim.runs import RunSpec, domain_topology, run_lengths
    seen = []

    class Recorded(SearchBudget):  # the search's budget object of each plan, to read its units
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            seen.append(self)

    strategies.SearchBudget = Recorded
    cases = []
    for n, nodes in LATENCY_CASES:
        lengths = np.random.default_rng(0).lognormal(7.5, 1.3, n).clip(1, 65536).astype(np.int64)
        topo = Topology(nodes, 8, prof.nics_per_node, prof.gpu_to_nic)
        cases.append((f"{n} docs / {nodes * 8} ranks", Planner(topo, prof, model, _config(gpus_per_node=8, plan_budget_ms=1e9)),
                      [lengths]))
    for cl, model_name, tp, dataset, context, nodes, per_gpu, recompute in RUN_CASES:
        per_gpu, capacity, recompute = batch_and_recompute(cl, model_name, tp, nodes, per_gpu, recompute)
        p, m = load_profile(cl), load_model(model_name)
        topo = domain_topology(p, nodes)
        spec = RunSpec("rate", cl, model_name, tp, dataset, context, nodes, per_gpu, capacity=capacity, batches=3,
                       recompute=recompute)
        cfg = _config(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node, gpu_nic_map=topo.gpu_to_nic,
                      cluster=cl, recompute=recompute, tp=tp, capacity_tokens=capacity, plan_budget_ms=1e9)
        cases.append(("run " + "/".join(map(str, (cl, model_name, dataset))), Planner(topo, p, m, cfg),
                      run_lengths(spec, topo.world_size)))
    rows, rates = [], []
    for name, planner, batches in cases:
        for b in batches:
            planner.plan(b)  # warm-up
            for _ in range(repeats):
                c0 = time.process_time()
                plan = planner.plan(b)
                cpu = time.process_time() - c0
                units = seen[-1].spent + seen[-1].partitioner  # the partitioner's units: recorded, not spent
                rates.append(units / cpu)
                rows.append({"case": name, "docs": len(b), "units": units, "cpu_s": cpu, "rate": units / cpu,
                             "cut_budget": dict(plan.meta).get("cut_budget", "")})
        r = [x["rate"] for x in rows if x["case"] == name]
        print(f"budget rate {name:40s}: {statistics.median(r):.3g} units/s ({rows[-1]['units']:.0f} units a plan)",
              flush=True)
    strategies.SearchBudget = SearchBudget
    return {"rate_units_per_s": statistics.median(rates), "plans": rows, "load_average": os.getloadavg()[0]}


def where_time_goes(n_docs: int, nodes: int, prof, model, top: int = 12) -> list:
    """One zeppelin plan_batch under cProfile: the planner's functions of most cumulative time,
    [(function, seconds, share of the whole)] (the shares nest: a caller includes its callees)."""
    import cProfile
    import pstats
    rng = np.random.default_rng(0)
    lengths = rng.lognormal(7.5, 1.3, n_docs).clip(1, 65536).astype(np.int64)
    topo = Topology(nodes, 8, prof.nics_per_node, prof.gpu_to_nic)
    plan_batch(lengths, topo, prof, model)
    pr = cProfile.Profile()
    pr.enable()
    plan_batch(lengths, topo, prof, model)
    pr.disable()
    st = pstats.Stats(pr).stats
    total = max(v[3] for v in st.values())
    rows = sorted(((f"{os.path.basename(k[0])}:{k[2]}", v[3]) for k, v in st.items()
                   if "megatron_zeppelin" in k[0] and k[2] not in ("plan_batch",)), key=lambda x: -x[1])[:top]
    return [(name, t, t / total) for name, t in rows]


def quality(datasets, seeds, prof, model) -> list:
    from megatron_zeppelin.data.workloads import sample_batch
    topo = Topology(4, 8, prof.nics_per_node, prof.gpu_to_nic)
    rows = []
    for ds in datasets:
        for seed in seeds:
            lengths = sample_batch(ds, 1 << 20, seed=seed, max_len=65536)
            row = {"dataset": ds, "seed": seed, "docs": int(len(lengths)), "strategies": {}}
            for s in STRATEGIES:
                p = plan_batch(lengths, topo, prof, model, strategy=s)
                row["strategies"][s] = {"predicted_iteration_s": p.predicted_iteration_s,
                                        "imbalance": p.imbalance, "lower_bound_s": p.lower_bound_s,
                                        "ratio_to_lower_bound": p.predicted_iteration_s / p.lower_bound_s,
                                        "classes": p.class_counts()}
            rows.append(row)
    return rows


def sweep(clusters, node_counts, contexts, datasets, model) -> list:
    """Zeppelin vs every baseline, seed 0, 256K tokens per node, per (cluster, nodes, context, dataset)."""
    from megatron_zeppelin.data.workloads import sample_batch
    rows = []
    for cl in clusters:
        prof = load_profile(cl)
        for nodes in node_counts:
            topo = Topology(nodes, 8, prof.nics_per_node, prof.gpu_to_nic)
            for ctx_len in contexts:
                for ds in datasets:
                    lengths = sample_batch(ds, nodes << 18, seed=0, max_len=ctx_len)
                    row = {"cluster": cl, "nodes": nodes, "context": ctx_len, "dataset": ds,
                           "docs": int(len(lengths)), "max_len": int(max(lengths)), "strategies": {}}
                    for s in STRATEGIES:
                        p = plan_batch(lengths, topo, prof, model, strategy=s)
                        row["strategies"][s] = {"predicted_iteration_s": p.predicted_iteration_s,
                                                "imbalance": p.imbalance,
                                                "ratio_to_lower_bound": p.predicted_iteration_s / p.lower_bound_s,
                                                "classes": p.class_counts()}
                    z = row["strategies"]["zeppelin"]
                    best = min((v["predicted_iteration_s"], k) for k, v in row["strategies"].items() if k != "zeppelin")
                    row["best_baseline"], row["speedup_vs_best"] = best[1], best[0] / z["predicted_iteration_s"]
                    row["speedup_vs_static_cp"] = (row["strategies"]["static_cp"]["predicted_iteration_s"]
                                                   / z["predicted_iteration_s"])
                    rows.append(row)
                    print(f"sweep {cl} {nodes:2d}x8 ctx {ctx_len >> 10}K {ds:10s}: zeppelin "
                          f"{z['predicted_iteration_s']:.3f} s imb {z['imbalance']:.3f} ratio "
                          f"{z['ratio_to_lower_bound']:.3f} classes {z['classes']}; best baseline {best[1]} "
                          f"{best[0]:.3f} s (x{row['speedup_vs_best']:.2f}); static_cp "
                          f"x{row['speedup_vs_static_cp']:.2f}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/bench_planner.json", help="JSON output path")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--cluster", default="a800")
    ap.add_argument("--model", default="llama-7b")
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="also run the cluster/nodes/context sweep")
    ap.add_argument("--profile", action="store_true", help="say where the planner's time goes (cProfile)")
    ap.add_argument("--sweep-clusters", nargs="+", default=["a800", "h200"])
    ap.add_argument("--sweep-nodes", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--sweep-contexts", type=int, nargs="+", default=[65536, 131072, 262144])
    ap.add_argument("--compare-src", default=None, help="a tree with another megatron_zeppelin: latency old / new")
    ap.add_argument("--rounds", type=int, default=3, help="alternating old/new processes per case (--compare-src)")
    ap.add_argument("--skip-runs", action="store_true", help="leave out the matrix's runs (RUN_CASES)")
    ap.add_argument("--balance-memory", action="store_true",
                    help="plan with --zeppelin-balance-memory (its planning time; not with --compare-src)")
    ap.add_argument("--budget-rate", action="store_true",
                    help="measure the planning rate (work units per CPU second: spec/config.PLAN_RATE_UNITS_PER_S)")
    ap.add_argument("--one-case", type=int, nargs=2, metavar=("DOCS", "NODES"), help=argparse.SUPPRESS)
    ap.add_argument("--one-run", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--scale", action="store_true", help="also the scale cases (up to 128k documents / 8192 ranks)")
    ap.add_argument("--one-scale", nargs=3, metavar=("MIX", "DOCS", "NODES"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.balance_memory and args.compare_src:
        ap.error("--balance-memory plans with a flag older trees lack: run it without --compare-src")
    global BALANCE_MEMORY
    BALANCE_MEMORY = args.balance_memory
    prof, model = load_profile(args.cluster), load_model(args.model)
    if args.one_scale:  # a child of --scale: one case, JSON on stdout
        mix, n, nodes = args.one_scale
        print(json.dumps(scale_case(mix, int(n), int(nodes), prof, model)))
        return 0
    if args.budget_rate:
        out = budget_rate(args.repeats, prof, model)
        print(f"planning rate: {out['rate_units_per_s']:.3g} units per CPU second (median of {len(out['plans'])} plans)")
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.out}")
        return 0
    if args.one_case or args.one_run is not None:  # a child of --compare-src: one case, JSON on stdout
        import megatron_zeppelin
        r = (run_latency(args.one_run, args.repeats) if args.one_case is None else
             latency(args.one_case[0], args.one_case[1], args.repeats, "zeppelin", prof, model))
        print(json.dumps(dict(r, package=os.path.dirname(megatron_zeppelin.__file__))))
        return 0
    if args.compare_src:
        out = {"cluster": args.cluster, "model": args.model, "compare": []}
        cases = [(["--one-case", str(n), str(nodes)], {"docs": n, "ranks": nodes * 8}, f"{n:6d} docs")
                 for n, nodes in LATENCY_CASES]
        cases += [] if args.skip_runs else [(["--one-run", str(k)], {"run": "/".join(map(str, c)), "ranks": c[5] * 8},
                                             "run " + "/".join(map(str, c)))
                                            for k, c in enumerate(RUN_CASES)]
        for case, info, name in cases:
            r = compare(case, info, args.repeats, args.rounds, os.path.abspath(args.compare_src), args)
            out["compare"].append(r)
            print(f"zeppelin {name} {r['ranks']:5d} ranks: new median {r['new_median_ms']:.1f} ms (CPU "
                  f"{r['new_cpu_median_ms']:.1f}), old {r['old_median_ms']:.1f} ms (CPU {r['old_cpu_median_ms']:.1f}): "
                  f"old/new {r['ratio_wall']:.2f}x wall, {r['ratio_cpu']:.2f}x CPU; least of all processes new "
                  f"{r['new_min_ms']:.1f}, old {r['old_min_ms']:.1f} ({r['ratio_min']:.2f}x) (load {r['load_average']:.1f})",
                  flush=True)
            if "new_planner_median_ms" in r:
                print(f"    new, one Planner for the run's batches: median {r['new_planner_median_ms']:.1f} ms, "
                      f"least {r['new_planner_min_ms']:.1f}", flush=True)
            if "new_planner_cpu_median_ms" in r and "old_planner_cpu_median_ms" in r:
                print(f"    one Planner, CPU median: new {r['new_planner_cpu_median_ms']:.1f} ms, old "
                      f"{r['old_planner_cpu_median_ms']:.1f} ms", flush=True)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.out}")
        return 0
    out = {"cluster": args.cluster, "model": args.model, "balance_memory": args.balance_memory, "latency": [],
           "quality": [], "sweep": []}
    for n, nodes in (() if args.skip_latency else LATENCY_CASES):
        for s in ("zeppelin", "packed_dp"):
            r = latency(n, nodes, args.repeats, s, prof, model)
            out["latency"].append(r)
            print(f"latency {s:10s} {n:6d} docs {r['ranks']:5d} ranks: median {r['median_ms']:.1f} ms "
                  f"(min {r['min_ms']:.1f}; CPU median {r['cpu_median_ms']:.1f}; load {r['load_average']:.1f}); "
                  f"one Planner for the run: median {r['planner_median_ms']:.1f} ms (min {r['planner_min_ms']:.1f})",
                  flush=True)
    for k in (() if args.skip_latency or args.skip_runs else range(len(RUN_CASES))):
        r = run_latency(k, args.repeats)
        out["latency"].append(r)
        print(f"latency zeppelin   run {r['run']} ({r['ranks']} ranks, {r['docs']} docs): median {r['median_ms']:.1f} "
              f"ms (min {r['min_ms']:.1f}; CPU median {r['cpu_median_ms']:.1f}; load {r['load_average']:.1f}); per "
              "batch " + ", ".join(f"{t:.0f} ms of a {s:.2f} s iteration" for t, s in
                                   zip(r["batch_ms"], r["predicted_iteration_s"])), flush=True)
    if args.profile:
        for n, nodes in LATENCY_CASES:
            rows = where_time_goes(n, nodes, prof, model)
            out.setdefault("profile", []).append({"docs": n, "ranks": nodes * 8, "functions": rows})
            print(f"where the time goes, {n} docs / {nodes * 8} ranks (cumulative, nested): " +
                  "; ".join(f"{name} {100 * share:.0f}%" for name, _, share in rows), flush=True)
    if not args.skip_quality:
        out["quality"] = quality(("arxiv", "github", "prolong64k"), args.seeds, prof, model)
        for row in out["quality"]:
            z = row["strategies"]["zeppelin"]
            best = min((v["predicted_iteration_s"], k) for k, v in row["strategies"].items() if k != "zeppelin")
            print(f"quality {row['dataset']:10s} seed {row['seed']}: zeppelin {z['predicted_iteration_s']:.2f} s "
                  f"imbalance {z['imbalance']:.3f} ratio {z['ratio_to_lower_bound']:.3f}; best baseline "
                  f"{best[1]} {best[0]:.2f} s", flush=True)
    if args.scale:
        out["scale"] = scale(args)
    if args.sweep:
        out["sweep"] = sweep(args.sweep_clusters, args.sweep_nodes, args.sweep_contexts,
                             ("arxiv", "github", "prolong64k"), model)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
