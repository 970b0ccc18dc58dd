"""How long each study of the matrix takes: run them one at a time, or estimate from recorded runs.

    .venv/bin/python scripts/time_studies.py run smoke sample moe       # runs each, one at a time
    .venv/bin/python scripts/time_studies.py estimate results/bench/*.json
    .venv/bin/python scripts/time_studies.py profile main a800 llama-7b prolong64k 2   # cProfile one run
    .venv/bin/python scripts/time_studies.py --out results/simspeed/timings.json --label after run smoke main:1/12

``--out PATH`` writes another timings file; ``--label L`` records ``run``'s rows under ``measured_L``
(e.g. before / after a change: run it with PYTHONPATH on each tree); a study ``S:K/N`` runs only its
shard K of N (`zeppelin bench --shard K/N`), recorded as ``S:K/N``.

``run`` runs `zeppelin bench --studies S --json results/attrib/timing/S.json` for each study S (with
`nice -n 10`) and records its wall-clock and CPU seconds (the child's user + system time: on a
shared machine the wall clock measures the others' load as much as ours). ``profile STUDY CLUSTER MODEL DATASET BATCHES`` runs the first
matching configuration of the matrix with that many batches under cProfile and writes the stats (.prof)
and their top functions (.txt) to results/attrib/profile/. ``estimate`` reads
`zeppelin bench --json` files and sums, per study, each run's recorded per-batch planning and
simulation seconds x its batches x the run-level settings it tried (a strategy simulates every
setting on every batch): the CPU time the study took when those files were made, without running
it again. Both merge their rows into results/attrib/timings.json (``measured`` and ``estimated``).
"""

import json
import os
import resource
import subprocess
import sys
import time
from collections import defaultdict

OUT = "results/attrib/timings.json"
LABEL = None  # --label: run's rows go to measured_LABEL


def _load():
    try:
        with open(OUT) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"note": __doc__.strip(), "measured": {}, "estimated": {}}


def _save(doc):
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    print(f"wrote {OUT}")


def run(studies):
    doc = _load()
    exe = os.path.join(os.path.dirname(sys.executable), "zeppelin")
    rows = doc.setdefault("measured" if LABEL is None else f"measured_{LABEL}", {})
    for s in studies:
        study, _, shard = s.partition(":")
        path = os.path.join(os.path.dirname(OUT), "timing" if LABEL is None else f"timing-{LABEL}",
                            s.replace(":", "-").replace("/", "-of-") + ".json")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(["nice", "-n", "10", exe, "bench", "--studies", study, "--no-progress", "--json", path]
                       + (["--shard", shard] if shard else []), check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        with open(path) as f:
            n = len({r["key"] for r in json.load(f)["runs"]})
        rows[s] = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "configurations": n,
                              "load_average_1m_after": round(os.getloadavg()[0], 1)}
        print(f"{s}: {wall:.0f} s wall, {cpu:.0f} s CPU, {n} configurations")
        _save(doc)


def estimate(paths):
    doc = _load()
    cpu, runs = defaultdict(float), defaultdict(set)
    for p in paths:
        try:
            with open(p) as f:
                d = json.load(f)
        except (OSError, ValueError):
            continue
        for r in d.get("runs", []):
            settings = len(r.get("tried") or {}) or 1
            cpu[r["study"]] += (r.get("plan_s", 0.0) + r.get("sim_s", 0.0)) * r.get("batches", 0) * settings
            runs[r["study"]].add(r["key"])
    for s in sorted(cpu):
        doc["estimated"][s] = {"cpu_s": round(cpu[s], 1), "configurations": len(runs[s]), "from": "recorded plan_s + sim_s"}
    doc["estimated_total_cpu_s"] = round(sum(cpu.values()), 1)
    _save(doc)
    for s in sorted(cpu):
        print(f"{s}: ~{cpu[s]:.0f} s CPU over {len(runs[s])} configurations")


def profile(argv):
    import cProfile
    import dataclasses
    import pstats

    from megatron_zeppelin.sim.matrix import load_matrix
    from megatron_zeppelin.sim.runs import run_config
    study, cluster, model, dataset, batches = argv
    items, _ = load_matrix(None)
    spec, variants, cps = next(it for it in items if (it[0].study, it[0].cluster, it[0].model, it[0].dataset) ==
                               (study, cluster, model, dataset))
    spec = dataclasses.replace(spec, batches=int(batches))
    name = f"results/attrib/profile/{study}-{cluster}-{model}-{dataset}-{batches}batches"
    os.makedirs(os.path.dirname(name), exist_ok=True)
    pr, cpu = cProfile.Profile(), time.process_time()
    pr.enable()
    run_config(spec, variants, None, cps)
    pr.disable()
    pr.dump_stats(name + ".prof")
    with open(name + ".txt", "w") as f:
        f.write(f"{spec.key()}: {time.process_time() - cpu:.1f} s CPU\n")
        pstats.Stats(pr, stream=f).sort_stats("cumulative").print_stats(40)
    print(f"wrote {name}.prof and .txt")


if __name__ == "__main__":
    while sys.argv[1].startswith("--"):  # --out PATH, --label L
        if sys.argv[1] == "--out":
            OUT = sys.argv[2]
        else:
            LABEL = sys.argv[2]
        del sys.argv[1:3]
    {"run": run, "estimate": estimate, "profile": profile}[sys.argv[1]](sys.argv[2:])
