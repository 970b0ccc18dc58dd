"""What `zeppelin bench --studies all` costs, per study, without running it: time a few runs, extrapolate.

    .venv/bin/python scripts/study_cost.py measure [--batches 1] [--studies main,memory] [--out results/report/cost.json]
    .venv/bin/python scripts/study_cost.py table [--matrix M] [--label estimate] [--out results/report/cost.json]

``measure`` loads the matrix (presets/runs/paper.yaml, with the studies' own batches and cuts), picks per
study its configuration of median size and its largest (size: tokens planned per batch, every micro-batch
over the domain's ranks, x strategies), runs each in this process (sim/runs.py ``run_config``, the same call as `zeppelin
bench`) with ``--batches`` batches, and records its CPU seconds (this process's user + system time: on a
shared machine the wall clock measures the others' load as much as ours) and its split into planning and
simulating (the records' plan_s / sim_s, wall seconds per batch and setting, summed). A study's estimate
is the measured CPU per unit of size x the study's whole size (every configuration's size x its own
batches / the measured batches): a ratio estimate, which assumes CPU grows with tokens planned. Rows
merge into ``--out`` (a study measured again replaces its rows; with ``--per-dataset`` each dataset's
median-size configuration is timed and added to them), with the command that made them.
``checked --studies S[:K/N] --batches N --cpu-s X --how CMD`` records a slice's estimate beside the CPU
seconds a real run of it took. ``table`` prints, and records under ``--label``, every study's estimate for the matrix as it stands (or
``--matrix``: `--matrix <main's paper.yaml> --label before_cuts` for the matrix before the cuts) and the
totals: all, and with planning twice as fast (the planning share halved). The first ``measure`` of
results/report/cost.json picked its configurations by sim/matrix.py ``_work`` (tokens x nodes), the
later ones by the size above: either pick serves a ratio estimate.
"""

import argparse
import json
import os
import resource
import sys
import time
from dataclasses import replace

from megatron_zeppelin.sim.matrix import load_matrix
from megatron_zeppelin.sim.runs import domain_topology, run_config
from megatron_zeppelin.spec.hardware import load_profile


def size(item) -> float:
    """A configuration's work per batch: tokens planned (every micro-batch, the domain's ranks: TP slices
    hold fewer) x strategies."""
    spec, variants, _ = item
    world = domain_topology(load_profile(spec.cluster), spec.domain_nodes, spec.tp).world_size
    return spec.tokens_per_gpu * world * spec.micro_batches * len(variants)


def _cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"note": __doc__.strip(), "studies": {}}


def picks(items, per_dataset: bool = False):
    """The configurations timed: the median-size one and the largest (one if they coincide); with
    ``per_dataset``, each dataset's median-size one instead (a study whose cost the dataset sets)."""
    if per_dataset:
        out = []
        for ds in dict.fromkeys(it[0].dataset for it in items):
            by = sorted((it for it in items if it[0].dataset == ds), key=size)
            out.append(by[(len(by) - 1) // 2])
        return out
    by = sorted(items, key=size)
    chosen = [by[(len(by) - 1) // 2], by[-1]]
    return chosen[:1] if chosen[0] is chosen[1] else chosen


def measure(args):
    doc = _load(args.out)
    items, _ = load_matrix(args.matrix)
    studies = sorted({it[0].study for it in items}, key=lambda s: [it[0].study for it in items].index(s))
    want = [s for s in args.studies.split(",") if s] if args.studies else studies
    for study in want:
        mine = [it for it in items if it[0].study == study]
        runs = [t for t in doc["studies"].get(study, {}).get("timed", [])] if args.per_dataset else []
        done = {t["key"] for t in runs}
        for spec, variants, cps in [it for it in picks(mine, args.per_dataset) if it[0].key() not in done]:
            b = min(args.batches, spec.batches)
            one = replace(spec, batches=b)
            c0, t0 = _cpu(), time.perf_counter()
            recs = run_config(one, variants, None, cps)
            cpu, wall = _cpu() - c0, time.perf_counter() - t0
            plan = sum(r.get("plan_s", 0.0) * b * max(1, len(r.get("tried") or {})) for r in recs)
            sim = sum(r.get("sim_s", 0.0) * b * max(1, len(r.get("tried") or {})) for r in recs)
            runs.append({"key": spec.key(), "batches_timed": b, "batches_in_study": spec.batches,
                         "micro_batches": spec.micro_batches, "variants": len(variants), "cpu_s": round(cpu, 1),
                         "wall_s": round(wall, 1), "cpu_s_per_batch": round(cpu / b, 2),
                         "plan_share": round(plan / (plan + sim), 3) if plan + sim else 0.0})
            runs[-1]["size_per_batch"] = size((one, variants, cps))
            print(f"{study}: {spec.key()} x{b} batch(es): {cpu:.1f} s CPU ({wall:.1f} s wall), "
                  f"plan share {runs[-1]['plan_share']:.2f}", flush=True)
        doc["studies"][study] = {"timed": runs}
        cmd = "nice -n 10 .venv/bin/python scripts/study_cost.py " + " ".join(sys.argv[1:])
        if cmd not in doc.setdefault("measure_commands", []):
            doc["measure_commands"].append(cmd)
        doc["machine_load_1m"] = round(os.getloadavg()[0], 1)
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)


def estimate(doc, items) -> dict:
    """Per study of ``items`` with timed rows: configurations, batches, the estimated CPU seconds (the timed
    CPU per unit of size x every configuration's size x its batches), and with planning twice as fast."""
    out = {}
    for study in dict.fromkeys(it[0].study for it in items):
        timed = doc.get("studies", {}).get(study, {}).get("timed")
        if not timed:
            continue
        mine = [it for it in items if it[0].study == study]
        by_key = {it[0].key(): it for it in mine}
        for t in timed:  # a row's size, kept: a cut matrix may no longer hold the configuration timed
            if "size_per_batch" not in t and t["key"] in by_key:
                t["size_per_batch"] = size(by_key[t["key"]])
        timed = [t for t in timed if "size_per_batch" in t]
        if not timed:
            continue
        rate = sum(t["cpu_s_per_batch"] for t in timed) / sum(t["size_per_batch"] for t in timed)
        share = sum(t["plan_share"] * t["cpu_s"] for t in timed) / max(1e-9, sum(t["cpu_s"] for t in timed))
        est = rate * sum(size(it) * it[0].batches for it in mine)
        out[study] = {"configurations": len(mine), "batches": sorted({it[0].batches for it in mine}),
                      "cpu_s_per_configuration": round(est / len(mine), 1), "estimated_cpu_s": round(est),
                      "plan_share": round(share, 3), "estimated_cpu_s_planning_2x_faster": round(est * (1 - share / 2))}
    return out


def table(args, label: str = "estimate"):
    """Print (and record under ``label``) the estimate of the matrix as it stands."""
    doc = _load(args.out)
    items, _ = load_matrix(args.matrix)
    rows = estimate(doc, items)
    print(f"{'study':<22}{'configs':>8}{'batches':>9}{'CPU s/config':>14}{'est. CPU s':>12}{'plan share':>11}"
          f"{'planning 2x':>12}")
    for s, r in rows.items():
        print(f"{s:<22}{r['configurations']:>8}{str(r['batches']):>9}{r['cpu_s_per_configuration']:>14.0f}"
              f"{r['estimated_cpu_s']:>12}{r['plan_share']:>11.2f}{r['estimated_cpu_s_planning_2x_faster']:>12}")
    tot = sum(r["estimated_cpu_s"] for r in rows.values())
    fast = sum(r["estimated_cpu_s_planning_2x_faster"] for r in rows.values())
    print(f"total: ~{tot} CPU s; with planning 2x faster ~{fast} CPU s; --jobs 2 on 2 cores: "
          f"~{fast / 2 / 60:.0f} min wall at best")
    doc["note"] = __doc__.strip()
    doc[label] = {"studies": rows, "total_cpu_s": tot, "total_cpu_s_planning_2x_faster": fast,
                  "wall_min_jobs2_planning_2x_faster": round(fast / 2 / 60),
                  "command": "nice -n 10 .venv/bin/python scripts/study_cost.py " + " ".join(sys.argv[1:])}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


def checked(args):
    """Record a slice's estimate beside the CPU seconds a real `zeppelin bench` run of it took (read off
    `/usr/bin/time`): how far the ratio estimate is off. ``--studies`` names the slice (``S`` or
    ``S:K/N``, comma-separated), ``--batches`` its batches (0: each study's own)."""
    doc = _load(args.out)
    items, _ = load_matrix(args.matrix)
    rates = {}
    for study in dict.fromkeys(it[0].study for it in items):
        timed = [t for t in doc.get("studies", {}).get(study, {}).get("timed", []) if "size_per_batch" in t]
        if timed:
            rates[study] = sum(t["cpu_s_per_batch"] for t in timed) / sum(t["size_per_batch"] for t in timed)
    est = 0.0
    for part in args.studies.split(","):
        study, _, shard = part.partition(":")
        mine = [it for it in items if it[0].study == study]
        if shard:
            k, n = (int(x) for x in shard.split("/"))
            mine = mine[k - 1::n]
        est += sum(rates[study] * size(it) * (args.batches or it[0].batches) for it in mine)
    doc.setdefault("checks", []).append({"slice": args.studies, "batches": args.batches or "own",
                                         "estimated_cpu_s": round(est), "measured_cpu_s": args.cpu_s,
                                         "measured_by": args.how})
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"{args.studies}: estimated {est:.0f} CPU s, measured {args.cpu_s:.0f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("measure", "table", "checked"))
    p.add_argument("--cpu-s", type=float, default=0.0, help="checked: the run's user + system CPU seconds")
    p.add_argument("--how", default="", help="checked: the command that ran the slice")
    p.add_argument("--matrix", default=None)
    p.add_argument("--studies", default="")
    p.add_argument("--batches", type=int, default=1)
    p.add_argument("--per-dataset", action="store_true",
                   help="measure: time each dataset's median configuration too, kept beside the study's rows")
    p.add_argument("--out", default="results/report/cost.json")
    p.add_argument("--label", default="estimate", help="table: record the estimate under this name")
    a = p.parse_args()
    {"measure": measure, "checked": checked}.get(a.what, lambda x: table(x, x.label))(a)
