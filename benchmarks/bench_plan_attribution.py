"""Where one Zeppelin plan's time goes, step by step of the search, against the search budget.

Issue 54's goal is planning at most 10% of the predicted iteration; the search budget
(planner/portfolio/budget.py) is meant to hold it there, but the partitioner's own rings are never
cut (their units are recorded, not spent) and the budget is charged in estimated work units. This
benchmark times each step of one plan of bench_planner.py's cases (its latency cases and the first
batch of each of its run cases, one Planner each, the plan after a warm-up one):

- ``greedy``: the partitioner's passes (partition.py ``_choose``), free and aligned rings;
- ``prepare partitioner``: the partitioner's placements prepared (layout, routed schedule, ring costs);
- ``a2a rings``: its intra rings priced as Ulysses too (ulysses_rings.py ``with_a2a_rings``);
- ``shape pool``: the fixed shapes' bounds and builds (portfolio/shapes.py ``candidate_placements``);
- ``prepare shapes``: the fixed shapes weighed, each with the units the budget charged for it
  (``placement_units``) beside its CPU time, so units per CPU second per shape (against
  spec/config.PLAN_RATE_UNITS_PER_S: a shape whose rate is far below it costs more than the budget
  believes);
- ``weigh and assemble``: the pick's remap, least prediction and assembly (strategies.py);
- ``other``: the rest of the plan (lower bound, memory choice, meta).

The steps are timed by wrapping the functions the search calls (CPU time; the wrappers cost a few
microseconds each). Writes JSON:

    PYTHONPATH=. .venv/bin/python benchmarks/bench_plan_attribution.py --out results/s62/attribution.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_planner  # noqa: E402  (its cases and their set-up)

import megatron_zeppelin.planner.partitioner.partition as partition  # noqa: E402
import megatron_zeppelin.planner.strategies as strategies  # noqa: E402
from megatron_zeppelin.planner import Planner  # noqa: E402
from megatron_zeppelin.planner.portfolio.budget import chunk_rows_of, placement_units  # noqa: E402
from megatron_zeppelin.spec.config import PLAN_RATE_UNITS_PER_S  # noqa: E402
from megatron_zeppelin.spec.hardware import load_profile  # noqa: E402
from megatron_zeppelin.spec.model import load_model  # noqa: E402
from megatron_zeppelin.spec.topology import Topology  # noqa: E402

STEPS = ("greedy", "prepare partitioner", "a2a rings", "shape pool", "prepare shapes", "weigh and assemble", "other")


class Steps:
    """CPU seconds per step of the plans run inside ``timing()``, and a row per fixed shape prepared."""

    def __init__(self):
        self.seconds: Dict[str, float] = dict.fromkeys(STEPS, 0.0)
        self.shapes: List[dict] = []
        self._open: List[str] = []  # the steps running, innermost last: a step's time excludes its inner steps'

    def enter(self, step: str) -> float:
        now = time.process_time()
        if self._open:  # the outer step pauses
            self.seconds[self._open[-1]] += now
        self._open.append(step)
        self.seconds[step] -= now
        return now

    def leave(self) -> float:
        now = time.process_time()
        self.seconds[self._open.pop()] += now
        if self._open:
            self.seconds[self._open[-1]] -= now
        return now

    def wrap(self, step, fn):
        def timed(*a, **kw):
            self.enter(step)
            try:
                return fn(*a, **kw)
            finally:
                self.leave()
        return timed

    def wrap_generator(self, step, fn):
        def timed(*a, **kw):
            it = iter(fn(*a, **kw))
            while True:
                self.enter(step)
                try:
                    item = next(it)
                except StopIteration:
                    return
                finally:
                    self.leave()
                yield item
        return timed

    def prepare(self, fn):
        def timed(ctx, placement, *a, **kw):
            shape = placement.meta.get("shape")
            step = "prepare shapes" if shape else "prepare partitioner"
            t0 = self.enter(step)
            try:
                return fn(ctx, placement, *a, **kw)
            finally:
                t1 = self.leave()
                if shape:
                    topo = ctx.topology
                    units = placement_units(placement, topo.world_size, topo.gpus_per_node, chunk_rows_of(ctx))
                    self.shapes.append({"shape": shape + ("+routing" if placement.routing else ""),
                                        "units": units, "cpu_s": t1 - t0})
        return timed

    @contextlib.contextmanager
    def timing(self):
        """The search's functions wrapped for the block (restored after)."""
        patched = [(partition, "_choose", self.wrap("greedy", partition._choose)),
                   (partition, "prepare", self.prepare(partition.prepare)),
                   (partition, "with_a2a_rings", self.wrap("a2a rings", partition.with_a2a_rings)),
                   (partition, "candidate_placements",
                    self.wrap_generator("shape pool", partition.candidate_placements)),
                   (strategies, "remapped", self.wrap("weigh and assemble", strategies.remapped)),
                   (strategies, "least_iteration_s", self.wrap("weigh and assemble", strategies.least_iteration_s)),
                   (strategies, "assemble", self.wrap("weigh and assemble", strategies.assemble))]
        saved = [(m, name, getattr(m, name)) for m, name, _ in patched]
        for m, name, fn in patched:
            setattr(m, name, fn)
        try:
            yield self
        finally:
            for m, name, fn in saved:
                setattr(m, name, fn)


def attribute(planner: Planner, lengths) -> dict:
    """One plan of ``lengths`` by ``planner`` (after a warm-up plan), its steps' CPU seconds."""
    planner.plan(lengths, "zeppelin")
    steps = Steps()
    with steps.timing():
        steps.enter("other")
        t0 = time.process_time()
        plan = planner.plan(lengths, "zeppelin")
        total = time.process_time() - t0
        steps.leave()
    predicted = plan.predicted_with_allreduce_s
    meta = plan.meta
    return {"docs": len(lengths), "ranks": planner.topology.world_size, "cpu_s": total,
            "predicted_iteration_s": predicted, "share_of_iteration": total / predicted,
            "variant": meta.variant, "cut_budget": getattr(meta, "cut_budget", None) or "",
            "steps": steps.seconds, "shapes": steps.shapes,
            "shapes_units_per_s": (sum(s["units"] for s in steps.shapes) / sum(s["cpu_s"] for s in steps.shapes)
                                   if steps.shapes and sum(s["cpu_s"] for s in steps.shapes) > 0 else None)}


def latency_case(n_docs: int, nodes: int) -> dict:
    """bench_planner's latency case: a800, llama-7b, lognormal lengths (seed 0)."""
    prof, model = load_profile("a800"), load_model("llama-7b")
    lengths = np.random.default_rng(0).lognormal(7.5, 1.3, n_docs).clip(1, 65536).astype(np.int64)
    topo = Topology(nodes, 8, prof.nics_per_node, prof.gpu_to_nic)
    out = attribute(Planner(topo, prof, model, bench_planner._config(gpus_per_node=8)), lengths)
    return dict(out, case=f"{n_docs} docs / {nodes * 8} ranks")


def run_case(k: int) -> dict:
    """The first batch of bench_planner's run case ``k``, planned as the run plans it."""
    from megatron_zeppelin.sim.matrix import batch_and_recompute
    from megatron_zeppelin.sim.runs import RunSpec, domain_topology, run_lengths
    cl, model_name, tp, dataset, context, nodes, per_gpu, recompute = bench_planner.RUN_CASES[k]
    per_gpu, capacity, recompute = batch_and_recompute(cl, model_name, tp, nodes, per_gpu, recompute)
    prof, model = load_profile(cl), load_model(model_name)
    topo = domain_topology(prof, nodes)
    spec = RunSpec("latency", cl, model_name, tp, dataset, context, nodes, per_gpu, capacity=capacity, batches=1,
                   recompute=recompute)
    config = bench_planner._config(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                                   gpu_nic_map=topo.gpu_to_nic, cluster=cl, recompute=recompute, tp=tp,
                                   capacity_tokens=capacity)
    out = attribute(Planner(topo, prof, model, config), run_lengths(spec, topo.world_size)[0])
    return dict(out, case="run " + "/".join(map(str, bench_planner.RUN_CASES[k])))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/plan_attribution.json", help="JSON output path")
    ap.add_argument("--skip-runs", action="store_true", help="only bench_planner's latency cases")
    args = ap.parse_args(argv)
    rows = [latency_case(n, nodes) for n, nodes in bench_planner.LATENCY_CASES]
    rows += [] if args.skip_runs else [run_case(k) for k in range(len(bench_planner.RUN_CASES))]
    for r in rows:
        steps = ", ".join(f"{s} {1e3 * r['steps'][s]:.0f}" for s in STEPS)
        rate = r["shapes_units_per_s"]
        print(f"{r['case']}: {1e3 * r['cpu_s']:.0f} ms CPU, {100 * r['share_of_iteration']:.1f}% of a "
              f"{r['predicted_iteration_s']:.2f} s iteration; ms: {steps}; shapes weighed {len(r['shapes'])}"
              + (f" at {rate:.3g} units per CPU second (budget's rate {PLAN_RATE_UNITS_PER_S:.3g})" if rate else ""),
              flush=True)
        for s in sorted(r["shapes"], key=lambda s: -s["cpu_s"])[:3]:
            print(f"    {s['shape']}: {1e3 * s['cpu_s']:.0f} ms CPU for {s['units']:.0f} units "
                  f"({s['units'] / max(s['cpu_s'], 1e-9):.3g} per second)", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"rate_units_per_s": PLAN_RATE_UNITS_PER_S, "steps": STEPS, "cases": rows}, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
