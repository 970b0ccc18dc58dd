"""What ``zeppelin simulate`` prints and writes: one strategy in detail, every strategy on the same batch
(``--compare``), the spread over sampled batches (``--seeds``). Numbers come from the plans of an
iteration's steps (planner/iteration.py Iteration) and the simulator's SimResult of the whole iteration
(sim/iteration.py accumulate); nothing here computes a cost."""

from __future__ import annotations

from typing import Dict, Sequence

import numpy as np

from megatron_zeppelin.reports import plan as plan_report
from megatron_zeppelin.reports.plan import _console, _s, _table


def _classes(plan) -> str:
    cc = plan.class_counts()
    return f"{cc['local']} local, {cc['intra']} intra-node, {cc['inter']} inter-node"


def lower_bound(it, res) -> float:
    """The steps' lower bounds (in 1F1B with pipeline stages) plus the all-reduce as the simulator exposes it."""
    from megatron_zeppelin.planner.iteration import pipeline_s
    bounds = [p.lower_bound_s for p in it.steps]
    return (sum(bounds) if it.stages == 1 else pipeline_s(bounds, it.stages)) + res.allreduce_exposed_s


def planner_s(it, res) -> float:
    """The planner's prediction of the iteration: its steps (in 1F1B with pipeline stages) plus the
    same exposed all-reduce."""
    return it.pipeline_s + res.allreduce_exposed_s


def print_detail(out, label: str, it, res, choice: str, args) -> None:
    n = len(it.steps)
    print(f"\n{label}: documents {_classes(it)}" + (f" over {n} steps" if n > 1 else "")
          + (f"; {choice}" if choice else ""), file=out)
    steps = ("1 step" if n == 1 else
             f"{n} gradient-accumulation steps, global micro-batches sampled with seeds {args.seed}..{args.seed + n - 1}")
    print(f"simulated iteration  {res.iteration_s:10.4f} s   (as Megatron logs it: {steps}, then the DP all-reduce; "
          f"{'one layer simulated, x' if res.mode == 'scale' else 'all'} {res.layers} layers)", file=out)
    print(f"  step               {(res.iteration_s - res.allreduce_exposed_s) / n:10.4f} s   (one global micro-batch: "
          f"forward, head, backward{', the mean of the steps' if n > 1 else ''})", file=out)
    print(f"  forward            {res.forward_s:10.4f} s", file=out)
    print(f"  vocab head         {res.head_s:10.4f} s", file=out)
    print(f"  backward           {res.backward_s:10.4f} s", file=out)
    print(f"  DP all-reduce      {res.allreduce_exposed_s:10.4f} s exposed of {res.allreduce_s:.4f} s "
          f"({'overlapped with' if args.overlap_grad_reduce else 'after'} the backward)", file=out)
    print(f"planner prediction   {planner_s(it, res):10.4f} s  "
          f"({'plan' if n == 1 else f'{n} plans'} {it.steps_s:.4f} + the same all-reduce)", file=out)
    lb = lower_bound(it, res)
    print(f"lower bound          {lb:10.4f} s   simulated / lower bound = {res.iteration_s / lb:.3f}", file=out)
    busy = [sum(d.values()) for d in res.rank_compute_s]
    print(f"compute per rank     max {max(busy):.4f} s, mean {sum(busy) / len(busy):.4f} s "
          f"(max/mean {max(busy) / (sum(busy) / len(busy)):.3f})", file=out)
    print(f"bytes moved          NVLink {res.link_bytes.get('nvlink', 0) / 1e9:.2f} GB, "
          f"NIC {res.link_bytes.get('nic', 0) / 1e9:.2f} GB", file=out)
    if res.nic and it.first.topology.nodes > 1:
        u = [max(n["util_out"], n["util_in"]) for n in res.nic]
        print(f"NIC utilisation      max {max(u):.3f}, mean {sum(u) / len(u):.3f}, "
              f"used {sum(1 for n in res.nic if n['bytes_out'] > 0)} of {len(res.nic)} NICs", file=out)


def compare_records(results: Dict[str, object]) -> Dict[str, dict]:
    z = results.get("zeppelin")
    out = {}
    for v, r in results.items():
        if isinstance(r, str):
            out[v] = {"error": r}
            continue
        it, res = r
        rec = {"iteration_s": res.iteration_s, "ratio_to_lower_bound": res.iteration_s / lower_bound(it, res),
               "predicted_iteration_s": planner_s(it, res), "steps": len(it.steps),
               "step_s": (res.iteration_s - res.allreduce_exposed_s) / len(it.steps), "classes": it.class_counts()}
        if not isinstance(z, str) and z is not None:
            rec["zeppelin_speedup"] = res.iteration_s / z[1].iteration_s
        out[v] = rec
    return out


def print_compare(out, results: Dict[str, object], labels: Dict[str, str], cp_size: int = 0) -> None:
    con = _console(out)
    t = _table("strategy", "simulated s", "step s", "planner s", "x lower bound", "zeppelin speedup",
               "local/intra/inter", title="every strategy on the same batch (simulated)")
    missing = []
    for v, rec in compare_records(results).items():
        if "error" in rec:
            t.add_row(labels[v], "-", "-", "-", "-", "-", "-")
            missing.append(f"  {labels[v]}: {rec['error']}")
            continue
        cc = rec["classes"]
        t.add_row(labels[v], _s(rec["iteration_s"]), _s(rec["step_s"]), _s(rec["predicted_iteration_s"]),
                  f"{rec['ratio_to_lower_bound']:.3f}",
                  f"{rec['zeppelin_speedup']:.2f}x" if "zeppelin_speedup" in rec else "-",
                  f"{cc['local']}/{cc['intra']}/{cc['inter']}")
    con.print(t)
    for line in missing:
        print(line, file=out)
    print("simulated s = the iteration (every step, then the DP all-reduce); step s = one global micro-batch (the mean "
          "step); zeppelin speedup = strategy's simulated iteration / Zeppelin's; x lower bound = simulated / "
          "(perfectly balanced work, all communication hidden, + the DP all-reduce)", file=out)
    if not cp_size:
        print("static CP / all-gather CP: CP size picked per batch by prediction (--cp-size 0), an upper bound on a "
              "run with one fixed CP size (give --cp-size N for that)", file=out)


def _stats(v):
    a = np.asarray(v, dtype=float)
    return {"mean": float(a.mean()), "std": float(a.std()), "min": float(a.min()), "max": float(a.max()),
            "n": int(a.size)} if a.size else None


def seed_spread(per_seed: Sequence[Dict[str, object]], variants) -> Dict[str, dict]:
    """Per strategy over the batches: simulated iteration, ratio to the lower bound, Zeppelin's speedup."""
    out = {}
    for v in variants:
        ok = [d for d in per_seed if not isinstance(d[v], str)]
        sp = [d[v][1].iteration_s / d["zeppelin"][1].iteration_s for d in ok
              if "zeppelin" in d and not isinstance(d["zeppelin"], str)]
        out[v] = {"iteration_s": _stats([d[v][1].iteration_s for d in ok]),
                  "ratio_to_lower_bound": _stats([d[v][1].iteration_s / lower_bound(*d[v]) for d in ok]),
                  "zeppelin_speedup": _stats(sp), "failed": len(per_seed) - len(ok)}
    return out


def print_spread(out, spread: Dict[str, dict], labels: Dict[str, str], first: int, count: int, steps: int = 1) -> None:
    plan_report.print_spread(out, spread, first, count, steps, time_key="iteration_s", column="simulated s mean",
                             labels=labels)
