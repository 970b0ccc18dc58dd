"""How well the search budget's work units (planner/portfolio/budget.py ``placement_units``) track the
CPU time of preparing a placement: static_cp shapes on a800 / llama-7b, unrouted and routed, from one
64K document on 16 ranks to 1,000 documents (lognormal, seed 0) on 64; each row's units, CPU seconds
and units per second, against spec/config.PLAN_RATE_UNITS_PER_S. Units that grow as the CPU does keep
the rate flat across rows (the budget then cuts what would take too long, no more). Writes JSON:

    PYTHONPATH=. .venv/bin/python benchmarks/bench_plan_units.py --out results/plan54/units.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace

import numpy as np

from megatron_zeppelin.planner.baselines.static_cp import cp_placement
from megatron_zeppelin.planner.build.assemble import prepare
from megatron_zeppelin.planner.context import PlanContext
from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.planner.portfolio.budget import chunk_rows_of, placement_units
from megatron_zeppelin.spec.config import PLAN_RATE_UNITS_PER_S, ZeppelinConfig
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.spec.words import Comm

CASES = (("one 64K document", 1, 2, 16), ("1k documents", 1000, 8, 16), ("1k documents", 1000, 8, 64))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/plan54/units.json")
    args = ap.parse_args(argv)
    prof, model = load_profile("a800"), load_model("llama-7b")
    rows = []
    for name, n, nodes, cp in CASES:
        lengths = [65536] if n == 1 else np.random.default_rng(0).lognormal(7.5, 1.3, n).clip(1, 65536).astype(int).tolist()
        topo = Topology(nodes, 8, prof.nics_per_node, prof.gpu_to_nic)
        ctx = PlanContext(topo, model, prof, ZeppelinConfig(gpus_per_node=8), CostModel(model, prof, topo), 1 << 40)
        for routing in (False, True):
            pl = replace(cp_placement(lengths, ctx, cp, Comm.P2P, pad=False), routing=routing)
            units = placement_units(pl, topo.world_size, topo.gpus_per_node, chunk_rows_of(ctx))
            c0 = time.process_time()
            prepare(ctx, pl)
            cpu = time.process_time() - c0
            rows.append({"case": name, "ranks": topo.world_size, "cp": cp, "routing": routing, "units": units,
                         "cpu_s": cpu, "units_per_s": units / cpu})
            print(f"{name:18s} {topo.world_size:3d} ranks cp{cp:<3d} {'routed' if routing else 'direct':6s} "
                  f"{units:10.0f} units {cpu:8.3f} s CPU {units / cpu:9.3g} units/s", flush=True)
    out = {"plan_rate_units_per_s": PLAN_RATE_UNITS_PER_S, "rows": rows, "load_average": os.getloadavg()[0]}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out} (PLAN_RATE_UNITS_PER_S = {PLAN_RATE_UNITS_PER_S:.3g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
