"""Which GPU cost term moves which speedup: a study of the benchmark matrix (default ``smoke``) run
with each GPU term of its clusters' profiles turned off in turn (issue 53).

The terms (spec/hardware.py; the GPU presets state them, cited or assumed):

- ``per_call``: each kernel sequence priced at its keys on its mask's table (``attention.by_sequence``);
  off: each block at its own query rows, as before;
- ``full``: the full-block tables (``attention.full_fwd_tflops`` / ``full_bwd_tflops``);
- ``tile``: below ``attention.tile_tokens`` the rate falls with the keys; off: clamped;
- ``launch``: the launch cost per kernel call (``attention.call_fwd_us`` / ``call_bwd_us``);
- ``message``: the per-message overhead of every hop (``message_us``);
- ``contention``: overlapped NCCL exchanges slow compute (``overlap_slowdown``);
- ``none``: all of them off at once.

Each variant's profile is written as a YAML under ``--profiles`` (the run then names that path as
its cluster); per variant the JSON holds Zeppelin's mean deployed and oracle speedup over every
baseline and over the best deployed one, Zeppelin's mean iteration and its ratio to the lower bound.

    .venv/bin/python benchmarks/bench_gpu_terms.py --studies smoke --json results/gputerms/terms-smoke.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace

from megatron_zeppelin.sim.gpu_terms import OFF as TERM_OFF
from megatron_zeppelin.sim.matrix import load_matrix, run_matrix, summarize, Progress
from megatron_zeppelin.spec.hardware import load_profile

# The terms as the matrix's `gpu_terms` study turns them off (sim/gpu_terms.py); "none": every term off.
OFF = {**{k: v for k, v in TERM_OFF.items() if k != "every"}, "none": TERM_OFF["every"]}


def _profile_path(cluster: str, term: str, folder: str) -> str:
    """The cluster's profile with ``term`` off, as a YAML the run can name ("all": the preset)."""
    if term == "all":
        return cluster
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{cluster}-no-{term}.yaml")
    p = load_profile(cluster)
    replace(p, name=f"{p.name}-no-{term}", **OFF[term]).save(path)
    return path


def _digest(records) -> dict:
    s = summarize(records)["summary"]
    zs = [r for r in records if r["variant"] == "zeppelin" and r.get("iteration_s")]
    out = {"zeppelin_iteration_s": sum(r["iteration_s"] for r in zs) / len(zs) if zs else None,
           "zeppelin_lower_bound": (s.get("zeppelin_lower_bound") or {}).get("mean")}
    for v, st in s.items():
        if isinstance(st, dict) and "deployed" in st:
            out[v] = {"deployed_mean": st["deployed"]["mean_speedup"], "deployed_min": st["deployed"]["min_speedup"],
                      "oracle_mean": st["oracle"]["mean_speedup"], "oracle_min": st["oracle"]["min_speedup"]}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--studies", nargs="+", default=["smoke"])
    ap.add_argument("--terms", nargs="+", default=["all", *OFF], choices=["all", *OFF])
    ap.add_argument("--profiles", default="results/gputerms/profiles")
    ap.add_argument("--json", required=True)
    a = ap.parse_args(argv)
    items = [it for it in load_matrix()[0] if it[0].study in a.studies]
    out, t0 = {"studies": a.studies, "terms": {}}, time.perf_counter()
    for k, term in enumerate(a.terms, 1):
        mine = [(replace(spec, cluster=_profile_path(spec.cluster, term, a.profiles)), v, cps) for spec, v, cps in items]
        recs = run_matrix(mine, progress=Progress.NONE)
        out["terms"][term] = _digest(recs)
        z = out["terms"][term]
        print(f"[{k}/{len(a.terms)}] {'all on' if term == 'all' else 'every term off' if term == 'none' else term + ' off'}: Zeppelin "
              f"{z['zeppelin_iteration_s']:.3f} s, over best deployed baseline "
              f"{z.get('best_baseline', {}).get('deployed_mean') or float('nan'):.3f}x "
              f"({time.perf_counter() - t0:.0f} s so far)", flush=True)
    os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {a.json} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
