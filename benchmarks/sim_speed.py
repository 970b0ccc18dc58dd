"""Simulator speed and identity against older code: the same plans simulated by two trees of
megatron_zeppelin, every result compared exactly, and the old / new ratio of simulation seconds.

Plans (``--capture``): slices of the paper matrix (``SLICES``: `zeppelin bench --studies S --batches 1
--shard K/N`, in process) with every ``simulate`` call's arguments pickled as the run makes them:
zeppelin, static_cp (routed and not), dynamic_cp, packed_dp, hybrid_dp, allgather_cp, accumulation's
recompute rungs, pipeline stages, MoE, 32 and 128 ranks. Planning is not timed; only ``simulate``.

Compare (``--compare-src DIR``: a tree holding another version of the package, e.g.
``git archive <commit> megatron_zeppelin | tar -x -C DIR``): each tree simulates every plan in its
own process (``--emit``, that tree on PYTHONPATH), ``--rounds`` times alternately; each result
(SimResult.to_dict with the timeline) must have the same repr in both trees (every float to the bit,
-0.0 included). The ratio is old / new of the sum over plans of each plan's least seconds.

    PYTHONPATH=. .venv/bin/python benchmarks/sim_speed.py --capture out/sim_plans.pkl
    git archive main megatron_zeppelin | tar -x -C out/sim_old
    PYTHONPATH=. .venv/bin/python benchmarks/sim_speed.py --plans out/sim_plans.pkl --compare-src out/sim_old \
        --out results/s55/sim_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (study, shard): --batches 1 slices; accumulation's a800 llama-7b prolong64k and scaling's 16 nodes are
# the heavy ones (most of the simulation seconds)
SLICES = (("accumulation", "1/20"), ("scaling", "4/12"), ("main", "1/36"), ("memory", "2/24"),
          ("moe", "1/4"), ("pipeline", "1/24"), ("ablation_cross_node", "3/3"))


def capture(path: str) -> None:
    import megatron_zeppelin.sim.runs as runs
    from megatron_zeppelin.cli import main
    calls = []
    orig = runs.simulate

    def recording(plan, profile, model, **kw):
        calls.append({"plan": plan, "profile": profile, "model": model, "kw": kw, "src": study})
        return orig(plan, profile, model, **kw)

    runs.simulate = recording
    for study, shard in SLICES:
        main(["bench", "--studies", study, "--batches", "1", "--shard", shard, "--no-progress",
              "--json", os.devnull])
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(calls, f)
    print(f"{len(calls)} simulate calls -> {path}")


def emit(plans: str, out: str) -> None:
    """Simulate every plan with the tree on PYTHONPATH: (seconds, result repr) per plan."""
    from megatron_zeppelin.sim.iteration import simulate
    with open(plans, "rb") as f:
        calls = pickle.load(f)
    rows = []
    for c in calls:
        t0 = time.perf_counter()
        res = simulate(c["plan"], c["profile"], c["model"], **c["kw"])
        rows.append((time.perf_counter() - t0, repr(res.to_dict(timeline=True))))
    with open(out, "wb") as f:
        pickle.dump(rows, f)


def _child(src: str, plans: str, out: str) -> list:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    subprocess.run([sys.executable, os.path.abspath(__file__), "--plans", os.path.abspath(plans),
                    "--emit", os.path.abspath(out)], env=env, check=True, cwd=src)
    with open(out, "rb") as f:
        return pickle.load(f)


def compare(plans: str, old: str, rounds: int, out: str) -> int:
    with open(plans, "rb") as f:
        src = [c["src"] for c in pickle.load(f)]
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    tmp = out + ".part"
    runs = {"new": [], "old": []}
    for _ in range(rounds):
        for name, tree in (("old", old), ("new", ROOT)):
            runs[name].append(_child(tree, plans, tmp))
    os.remove(tmp)
    differ = [i for i, (a, b) in enumerate(zip(runs["old"][0], runs["new"][0])) if a[1] != b[1]]
    least = {k: [min(r[i][0] for r in v) for i in range(len(src))] for k, v in runs.items()}
    by_src = defaultdict(lambda: [0, 0.0, 0.0])
    for i, s in enumerate(src):
        by_src[s][0] += 1
        by_src[s][1] += least["old"][i]
        by_src[s][2] += least["new"][i]
    old_s, new_s = sum(least["old"]), sum(least["new"])
    doc = {"benchmark": "simulator speed and identity (benchmarks/sim_speed.py)", "plans": len(src),
           "identical": not differ, "differing_plans": differ, "rounds": rounds, "old_src": old,
           "old_s": old_s, "new_s": new_s, "ratio": old_s / new_s,
           "by_slice": {s: {"plans": n, "old_s": o, "new_s": w, "ratio": o / w} for s, (n, o, w) in by_src.items()}}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    for s, d in doc["by_slice"].items():
        print(f"{s:<22} {d['plans']:4d} plans  old {d['old_s']:7.2f} s  new {d['new_s']:7.2f} s  x{d['ratio']:.2f}")
    print(f"{'all':<22} {len(src):4d} plans  old {old_s:7.2f} s  new {new_s:7.2f} s  x{old_s / new_s:.2f}; "
          + ("identical" if not differ else f"DIFFERENT on {len(differ)} plans: {differ[:10]}"))
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capture", metavar="FILE", help="plan the SLICES and pickle their simulate calls here")
    ap.add_argument("--plans", metavar="FILE", help="the pickled simulate calls (--capture)")
    ap.add_argument("--compare-src", metavar="DIR", help="a tree with the other version of megatron_zeppelin")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--emit", metavar="FILE", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="results/s55/sim_speed.json")
    args = ap.parse_args()
    if args.capture:
        capture(args.capture)
        return 0
    if not args.plans:
        ap.error("--plans FILE (or --capture FILE) is needed")
    if args.emit:
        emit(args.plans, args.emit)
        return 0
    if not args.compare_src:
        ap.error("--compare-src DIR is needed to compare")
    return compare(args.plans, args.compare_src, args.rounds, args.out)


if __name__ == "__main__":
    sys.exit(main())
