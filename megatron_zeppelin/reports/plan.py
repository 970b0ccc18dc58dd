"""What ``zeppelin plan`` prints and writes: tables and the JSON document, read from Plans.

Nothing here computes a cost: times come from ``Plan.cost`` / ``lower_bound_s`` and the iteration
of them (planner/iteration.py: the steps, then the DP all-reduce), classes and thresholds from the
Plan, crossovers from the planner's CostModel, the routed-step comparison from
planner.routing.explain_step, memory from flags/memory.py's MemorySetup (spec/memory.py).

>>> _s(8.881784197001252e-16), _s(0.0434), _s(12.2812)   # float noise prints as the 0 it is
('0', '0.0434', '12.28')
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table

from megatron_zeppelin.planner.iteration import Iteration
from megatron_zeppelin.planner.types import Plan
from megatron_zeppelin.spec.words import CLASSES, DocClass, Layout, Link


def _console(out, width: int = 132) -> Console:
    return Console(file=out, width=width, color_system=None, highlight=False, soft_wrap=True)


def _table(*cols, title=None) -> Table:
    t = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False)
    for i, c in enumerate(cols):
        t.add_column(c, justify="left" if i == 0 else "right")
    return t


TINY_S = 1e-9  # seconds below this are rounding noise of sums and differences (a nanosecond)


def _s(x: float) -> str:
    return "0" if abs(x) < TINY_S else f"{x:.4g}"


def _planned(p) -> bool:
    """A plan or an iteration of plans (not the reason a strategy could not be planned)."""
    return not isinstance(p, str)


def _steps(p):
    return p.steps if isinstance(p, Iteration) else (p,)


def print_header(out, batch: dict, topo, profile, model, args, domain=None) -> None:
    print(f"batch: {batch['dataset']} (seed {batch['seed']}): {batch['documents']} documents, "
          f"{batch['tokens']} tokens; length min {batch['min']} / median {batch['median']:.0f} / "
          f"mean {batch['mean']:.0f} / max {batch['max']}"
          + (f"; cut at context length {batch['context_length']}" if batch['context_length'] else ""), file=out)
    where = (topo.describe() if domain is None or domain.tp == 1 else
             f"{topo.nodes} node(s) x {topo.gpus_per_node} TP group(s), {topo.nics_per_node} NIC(s)/node")
    print(f"domain: {where} = {topo.world_size} ranks; cluster {profile.name} ({profile.gpu}); "
          f"model {model.name} ({model.layers} layers, hidden {model.hidden}, {model.heads}/{model.kv_heads} "
          f"heads){'; TP ' + str(args.tp) if args.tp > 1 else ''}", file=out)
    if domain is not None:
        print(f"GPUs: {domain.describe()}", file=out)


def class_summary(plan: Plan) -> Dict[str, dict]:
    """Per class: documents, tokens, shortest and longest."""
    out = {c: {"documents": 0, "tokens": 0, "min": 0, "max": 0} for c in CLASSES}
    for d in plan.docs:
        s = out[d.cls]
        s["min"] = d.length if s["documents"] == 0 else min(s["min"], d.length)
        s["max"] = max(s["max"], d.length)
        s["documents"] += 1
        s["tokens"] += d.length
    return out


def _thresholds_line(plan: Plan) -> str:
    """The thresholds as what they are: where splitting starts to pay by the cost model (eligibility),
    not the lengths of the classes the plan chose (the table below has those)."""
    th = plan.thresholds
    one_node = plan.topology.nodes < 2
    if plan.topology.world_size < 2:
        return "thresholds: one rank: every document is local"
    if not plan.strategy.startswith("zeppelin"):  # a baseline's thresholds describe what it produced
        why = th.reason.splitlines()[0] if th.reason else ""
        return f"thresholds: no cost-model crossovers for {plan.strategy}" + (f" ({why})" if why else "")
    if plan.meta.shape:  # Zeppelin took a baseline's fixed shape: its thresholds are that shape's classes
        why = th.reason.splitlines()[0] if th.reason else ""
        return (f"planned: Zeppelin took the fixed shape {plan.meta.shape} (no whole-document plan of its own was "
                "predicted faster), so there are no cost-model crossovers to show" + (f"; the shape: {why}" if why else ""))
    text = (f"thresholds (cost-model crossovers, not class boundaries): documents <= {th.local_max} tokens always "
            f"stay whole on one rank; from {th.local_max + 1} tokens a document may split over an intra-node ring, "
            + ("no document spans nodes (one node)" if one_node else
               f"from {th.intra_max + 1} tokens over nodes")
            + "; a longer document is split only when it does not fit one rank's (one node's) share of the "
              "batch, so classes overlap these ranges (why: --explain)")
    return text


def remap_tokens(plan: Plan) -> int:
    return sum(m.tokens for m in plan.remap if m.src != m.dst)


def memory_balance(plan: Plan, model, tp: int = 1) -> dict:
    """The plan's per-rank peak activation memory (spec/memory.py, both layouts, its recompute)."""
    from megatron_zeppelin.spec.memory import plan_memory_balance
    return plan_memory_balance(plan, model, tp, plan.meta.recompute or None)


def print_plan(out, it, max_ranks: int = 16, model=None, tp: int = 1, mem=None, first_seed: int = 0) -> None:
    """``it``: an Iteration (or one Plan: one step). The first step in detail, then the iteration."""
    it = it if isinstance(it, Iteration) else Iteration((it,))
    plan = it.first
    con = _console(out)
    print(f"\nstrategy {plan.strategy} (plan digest {plan.digest()})", file=out)
    print(_thresholds_line(plan), file=out)
    t = _table("class", "documents", "tokens", "shortest", "longest", "rings", "ring sizes",
               title="classes the plan chose")
    sizes = defaultdict(list)
    for r in plan.rings:
        sizes[r.cls].append(r.size)
    for c, s in class_summary(plan).items():
        t.add_row(c, str(s["documents"]), str(s["tokens"]), str(s["min"] or "-"), str(s["max"] or "-"),
                  str(len(sizes[c])), ",".join(str(x) for x in sorted(set(sizes[c]))) or "-")
    con.print(t)
    _print_ranks(con, plan, max_ranks, len(it.steps) > 1)
    lb = plan.lower_bound_s
    print(f"predicted step {plan.predicted_iteration_s:.4g} s (one global micro-batch, forward and backward); "
          f"imbalance (max/mean) {plan.imbalance:.3f}; lower bound {lb:.4g} s (perfect balance, communication "
          f"hidden); ratio to lower bound {plan.predicted_iteration_s / lb:.3f}", file=out)
    print(iteration_line(it, first_seed), file=out)
    if model is not None:
        m = memory_balance(plan, model, tp)
        cap = (f"; planned within {plan.meta.token_cap} tokens per rank (--zeppelin-balance-memory)"
               if plan.meta.token_cap else "")
        print(f"activation memory per rank (peak, attention and linear layouts, recompute "
              f"{plan.meta.recompute or 'none'}): max {m['max_bytes'] / 1e9:.2f} GB, max/mean {m['imbalance']:.3f}"
              f"{cap}", file=out)
        if mem is not None and mem.limit_bytes:
            worst = max(it.steps, key=lambda p: mem.gpu_bytes(p, model, tp))
            print(f"memory per GPU (model states {mem.states_bytes / 1e9:.1f} GB, distributed optimizer over "
                  f"{plan.world_size} ranks, + the fullest rank's activations): {mem.describe_fit(worst, model, tp)}"
                  + ("" if mem.fits(worst, model, tp) else
                     " (--recompute, more --nodes, a larger --tp or a smaller batch would fit it; zeppelin advise)"),
                  file=out)
    nic = sum(o.nbytes for o in plan.schedule if o.link == Link.NIC)
    nvl = sum(o.nbytes for o in plan.schedule if o.link == Link.NVLINK)
    print(f"remap moves {remap_tokens(plan)} tokens; ring schedule: {len(plan.schedule)} ops, "
          f"{nvl / 1e6:.1f} MB over NVLink and {nic / 1e6:.1f} MB over NICs per layer forward", file=out)


def iteration_line(it: Iteration, first_seed: int = 0) -> str:
    """The iteration as Megatron logs it: the steps back to back, then the DP all-reduce."""
    n = len(it.steps)
    if n == 1:
        steps = "1 step (the one above)"
    else:
        steps = (f"{n} gradient-accumulation steps (global micro-batches sampled with seeds {first_seed}.."
                 f"{first_seed + n - 1}, the first shown above: " + ", ".join(_s(p.predicted_iteration_s)
                                                                              for p in it.steps) + " s)")
    return (f"predicted iteration {it.predicted_iteration_s:.4g} s, as Megatron logs it: {steps} + the DP gradient "
            f"all-reduce {_s(it.allreduce_s)} s (the same for every strategy, after the backward); "
            f"ratio to lower bound {it.predicted_iteration_s / it.lower_bound_s:.3f}")


def _rank_row(plan: Plan, r: int) -> List[str]:
    c = plan.cost[r]
    return [str(r), str(plan.topology.node_of(r)), str(plan.tokens(r)), str(plan.tokens(r, Layout.LINEAR)),
            _s(c.attention_s), _s(c.linear_s), _s(c.comm_exposed_s), _s(c.remap_s), _s(c.total_s)]


def _print_ranks(con: Console, plan: Plan, max_ranks: int, first_of_many: bool = False) -> None:
    cols = ("rank", "node", "attn tokens", "linear tokens", "attention s", "linear s", "comm s", "remap s", "total s")
    world = plan.world_size
    which = "the first step" if first_of_many else "one step"
    if world <= max_ranks:
        t = _table(*cols, title=f"per-rank prediction ({which}: one global micro-batch, fwd+bwd, all layers)")
        for r in range(world):
            t.add_row(*_rank_row(plan, r))
        con.print(t)
        return
    t = _table(*cols, title=f"per-rank prediction over {world} ranks ({which}; summary, worst ranks below)")
    m = np.array([[plan.tokens(r), plan.tokens(r, Layout.LINEAR), c.attention_s, c.linear_s, c.comm_exposed_s,
                   c.remap_s, c.total_s] for r, c in enumerate(plan.cost)])
    for name, f in (("min", np.min), ("mean", np.mean), ("max", np.max)):
        v = f(m, axis=0)
        t.add_row(name, "", f"{v[0]:.0f}", f"{v[1]:.0f}", *(_s(float(x)) for x in v[2:]))
    worst = sorted(range(world), key=lambda r: (-plan.cost[r].total_s, r))[:3]
    for r in worst:
        t.add_row(*_rank_row(plan, r))
    con.print(t)


def print_compare(out, plans: Dict[str, object], cp_note: str = "", model=None, tp: int = 1, mem=None) -> None:
    """``plans``: {strategy: Iteration (or Plan), or why it could not be planned}."""
    con = _console(out, 170)  # one row per strategy: wider than a terminal rather than wrapped cells
    z = plans.get("zeppelin")
    mem_cols = ("memory imbalance",) if model is not None else ()
    fit = model is not None and mem is not None and bool(mem.limit_bytes)
    t = _table("strategy", "iteration s", "step s", "imbalance", *mem_cols, "x lower bound", "zeppelin speedup",
               "local/intra/inter", "cp size", *(("GB per GPU",) if fit else ()),
               title="all strategies on the same batch")
    missing, unfit = [], []
    for name, p in plans.items():
        if not _planned(p):
            t.add_row(name, "-", "-", "-", *("-" for _ in mem_cols), "-", "-", "-", "-", *(("-",) if fit else ()))
            missing.append(f"  {name}: {p}")
            continue
        it = p if isinstance(p, Iteration) else Iteration((p,))
        cc = it.class_counts()
        sp = f"{it.predicted_iteration_s / z.predicted_iteration_s:.2f}x" if _planned(z) and z is not None else "-"
        worst = max(it.steps, key=lambda q: memory_balance(q, model, tp)["max_bytes"]) if model is not None else None
        fits = ()
        if fit:
            ok = mem.fits(worst, model, tp)
            fits = (f"{mem.gpu_bytes(worst, model, tp) / 1e9:.1f}" + ("" if ok else " NO FIT"),)
            unfit += [] if ok else [name]
        t.add_row(name, _s(it.predicted_iteration_s), _s(it.step_s),
                  f"{it.imbalance:.3f}",
                  *((f"{memory_balance(worst, model, tp)['imbalance']:.3f}",) if mem_cols else ()),
                  f"{it.predicted_iteration_s / it.lower_bound_s:.3f}", sp,
                  f"{cc['local']}/{cc['intra']}/{cc['inter']}", str(dict(it.meta).get("cp_size", "-")), *fits)
    con.print(t)
    for line in missing:
        print(line, file=out)
    print("iteration s = the steps, then the DP all-reduce (as Megatron logs an iteration); step s = one global "
          "micro-batch's forward and backward (the mean step); zeppelin speedup = strategy's predicted iteration / "
          "zeppelin's; x lower bound = predicted / (perfectly balanced work, all communication hidden, + the "
          "all-reduce)"
          + ("; imbalance = max/mean per-rank time, memory imbalance = max/mean per-rank peak activation memory"
             if mem_cols else ""), file=out)
    if fit:
        print(f"GB per GPU = model states (distributed optimizer) + the fullest rank's activations, against "
              f"{mem.limit_bytes / 1e9:.0f} GB (90% of the GPU's memory; recompute {mem.recompute}); "
              + (f"NO FIT: {', '.join(unfit)} (their times are for a run that cannot start)" if unfit
                 else "every strategy fits"), file=out)
    if cp_note:
        print(cp_note, file=out)


def seed_spread(per_seed, names) -> Dict[str, dict]:
    """Per strategy, over the iterations of ``per_seed`` ([{strategy: Iteration, Plan or reason}] one per
    sampled iteration): the predicted iteration, ratio to the lower bound and Zeppelin's speedup (mean,
    std, min, max)."""
    def stats(v):
        a = np.asarray(v, dtype=float)
        return {"mean": float(a.mean()), "std": float(a.std()), "min": float(a.min()), "max": float(a.max()),
                "n": int(a.size)} if a.size else None
    out = {}
    for n in names:
        ps = [d[n] for d in per_seed if _planned(d[n])]
        zs = [d.get("zeppelin") for d in per_seed if _planned(d[n])]
        sp = [p.predicted_iteration_s / z.predicted_iteration_s for p, z in zip(ps, zs)
              if z is not None and _planned(z)]
        out[n] = {"predicted_iteration_s": stats([p.predicted_iteration_s for p in ps]),
                  "ratio_to_lower_bound": stats([p.predicted_iteration_s / p.lower_bound_s for p in ps]),
                  "imbalance": stats([p.imbalance for p in ps]), "zeppelin_speedup": stats(sp),
                  "failed": len(per_seed) - len(ps)}
    return out


def print_spread(out, spread: Dict[str, dict], first: int, count: int, steps: int = 1,
                 time_key: str = "predicted_iteration_s", column: str = "iteration s mean",
                 labels: Optional[Dict[str, str]] = None) -> None:
    """The mean and spread over sampled batches (or iterations) of each strategy's time under
    ``time_key`` (plan: predicted, simulate: simulated), ``labels`` naming the rows."""
    con = _console(out)
    what = (f"over {count} sampled batches (seeds {first}..{first + count - 1})" if steps == 1 else
            f"over {count} sampled iterations of {steps} steps (seeds {first}..{first + count * steps - 1})")
    t = _table("strategy", column, "std", "min", "max", "x lower bound mean", "zeppelin speedup mean",
               "speedup min-max", title=what)
    for n, r in spread.items():
        it, lb, sp = r[time_key], r["ratio_to_lower_bound"], r["zeppelin_speedup"]
        name = (labels or {}).get(n, n) + (f" ({r['failed']} failed)" if r["failed"] else "")
        if it is None:
            t.add_row(name, "-", "-", "-", "-", "-", "-", "-")
            continue
        t.add_row(name, _s(it["mean"]), _s(it["std"]), _s(it["min"]), _s(it["max"]), f"{lb['mean']:.3f}",
                  f"{sp['mean']:.3f}x" if sp else "-", f"{sp['min']:.2f}x-{sp['max']:.2f}x" if sp else "-")
    con.print(t)


def per_batch_note(cp_size: int) -> str:
    """Said under a table with the fixed-CP baselines: without --cp-size they get each batch's best size."""
    return ("" if cp_size else "static_cp / allgather_cp: CP size picked per batch by prediction (--cp-size 0), an "
            "upper bound on a run with one fixed CP size (give --cp-size N for that)")


def print_explain(out, plan: Plan, lengths, topo, profile, model, config) -> None:
    from megatron_zeppelin.planner import make_context
    cost = make_context(topo, profile, model, config, total_tokens=int(np.sum(lengths))).cost
    th = plan.thresholds
    print(f"\nwhy these thresholds ({plan.strategy}): local <= {th.local_max} < intra <= {th.intra_max} < inter",
          file=out)
    for line in th.reason.splitlines():
        print(f"  {line}", file=out)
    print("  A document split over a ring of G ranks computes ~attn(L)/G^2 per ring step while it moves L/G "
          "tokens of K/V\n  (" f"{cost.kv_bytes_per_token} B per token per layer for {model.name}); splitting "
          "pays once a step's compute hides its transfer.\n  Crossovers from the cost model "
          f"({profile.name}: NVLink {profile.nvlink_GBps} GB/s, NIC {profile.nic_GBps} GB/s):", file=out)
    per_nic = max(1, topo.gpus_per_node // topo.nics_per_node)
    g = 2
    while g <= topo.gpus_per_node:
        print(f"    ring of {g:4d} inside a node (NVLink): hides its transfer from L >= "
              f"{cost.crossover_length(g, 'nvlink')} tokens", file=out)
        g *= 2
    g = 2 * topo.gpus_per_node
    while g <= topo.world_size:
        print(f"    ring of {g:4d} over {g // topo.gpus_per_node} nodes, direct (each GPU's own NIC, shared by "
              f"{per_nic}): from L >= {cost.crossover_length(g, 'nic', share=per_nic)} tokens", file=out)
        g *= 2
    _explain_routing(out, plan, lengths, topo, cost, config)


def _inter_message(plan: Plan):
    """(bytes, tokens) of the largest inter-node message of the plan's first inter step, or None."""
    msgs = defaultdict(lambda: [0, 0])
    for o in plan.ops(DocClass.INTER, 0):
        if o.link == Link.NIC:
            m = msgs[(o.ring, o.block, o.msg_src, o.msg_dst)]
            m[0] += o.nbytes
            m[1] += o.stop - o.start
    return max(msgs.values()) if msgs else None


def _explain_routing(out, plan, lengths, topo, cost, config) -> None:
    msg = _inter_message(plan)
    if msg is not None:
        nbytes, rows = msg
        print(f"  One inter-node ring step of this plan: largest message {nbytes / 1e6:.2f} MB ({rows} tokens).",
              file=out)
    else:
        longest = int(np.max(lengths))
        g = 2 * topo.gpus_per_node
        nbytes = cost.kv_bytes_per_token * -(-longest // g)
        print(f"  No document spans nodes in this plan; for illustration: the longest document ({longest} tokens) "
              f"on a ring of {g} ranks over 2 nodes moves {nbytes / 1e6:.2f} MB per step.", file=out)
    try:
        from megatron_zeppelin.planner.build.routing import explain_step
    except ImportError:
        explain_step = None
    if explain_step is None:
        print(f"  direct over one NIC: {cost.transfer_s(nbytes, 'nic') * 1e3:.3f} ms per layer forward "
              "(routed comparison not available: planner.routing.explain_step missing)", file=out)
        return
    e = explain_step(cost, topo, nbytes, config)
    print(f"  {e['text']}", file=out)


def strategy_record(p: Plan, zeppelin, model=None, tp: int = 1) -> dict:
    """One Plan (one step) as JSON."""
    c = p.cost
    rec = {"predicted_iteration_s": p.predicted_iteration_s, "imbalance": p.imbalance,
           "ratio_to_lower_bound": p.predicted_iteration_s / p.lower_bound_s, "lower_bound_s": p.lower_bound_s,
           "thresholds": {"local_max": p.thresholds.local_max, "intra_max": p.thresholds.intra_max,
                          "reason": p.thresholds.reason},
           "classes": class_summary(p), "rings": len(p.rings), "remap_tokens": remap_tokens(p),
           "schedule_ops": len(p.schedule),
           "nic_bytes_per_layer_fwd": sum(o.nbytes for o in p.schedule if o.link == Link.NIC),
           "nvlink_bytes_per_layer_fwd": sum(o.nbytes for o in p.schedule if o.link == Link.NVLINK),
           "per_rank": {"attention_s": [x.attention_s for x in c], "linear_s": [x.linear_s for x in c],
                        "comm_exposed_s": [x.comm_exposed_s for x in c], "remap_s": [x.remap_s for x in c],
                        "total_s": [x.total_s for x in c],
                        "attention_tokens": [p.tokens(r) for r in range(p.world_size)],
                        "linear_tokens": [p.tokens(r, Layout.LINEAR) for r in range(p.world_size)]},
           "allreduce_s": p.allreduce_s, "meta": dict(p.meta), "digest": p.digest()}
    if isinstance(zeppelin, Plan):
        rec["zeppelin_speedup"] = p.predicted_iteration_s / zeppelin.predicted_iteration_s
    if model is not None:
        m = memory_balance(p, model, tp)
        rec.update(memory_imbalance=m["imbalance"], peak_activation_GB=m["max_bytes"] / 1e9)
    return rec


def iteration_record(it: Iteration, zeppelin, model=None, tp: int = 1, mem=None) -> dict:
    """A strategy's JSON: its first step's Plan (``strategy_record``, whose ``predicted_iteration_s`` is
    that step's, the Plan's field) plus ``iteration``: the whole iteration as Megatron logs it."""
    rec = strategy_record(it.first, zeppelin.first if isinstance(zeppelin, Iteration) else None, model, tp)
    rec["iteration"] = {"predicted_s": it.predicted_iteration_s, "steps": len(it.steps),
                        "step_predicted_s": [p.predicted_iteration_s for p in it.steps],
                        "allreduce_s": it.allreduce_s, "lower_bound_s": it.lower_bound_s,
                        "imbalance": it.imbalance, "digests": [p.digest() for p in it.steps]}
    if isinstance(zeppelin, Iteration):
        rec["iteration"]["zeppelin_speedup"] = it.predicted_iteration_s / zeppelin.predicted_iteration_s
    if mem is not None and model is not None and mem.limit_bytes:
        worst = max(it.steps, key=lambda p: mem.gpu_bytes(p, model, tp))
        rec["memory"] = {"gpu_GB": mem.gpu_bytes(worst, model, tp) / 1e9, "limit_GB": mem.limit_bytes / 1e9,
                         "states_GB": mem.states_bytes / 1e9, "fits": mem.fits(worst, model, tp)}
    return rec


def json_document(plans: Dict[str, object], main, batch: dict, topo, profile, model, args, mem=None) -> dict:
    """``plans``: {strategy: Iteration (or Plan), or reason}; ``main`` the one shown in detail."""
    wrap = (lambda p: p if isinstance(p, Iteration) or not _planned(p) else Iteration((p,)))
    plans = {n: wrap(p) for n, p in plans.items()}
    main = wrap(main)
    z = plans.get("zeppelin")
    strategies = {n: ({"error": p} if not _planned(p) else iteration_record(p, z, model, getattr(args, "tp", 1), mem))
                  for n, p in plans.items()}
    first = main.first
    return {"strategies": strategies, "strategy": first.strategy,
            "thresholds": {"local_max": first.thresholds.local_max, "intra_max": first.thresholds.intra_max,
                           "reason": first.thresholds.reason},
            "lower_bound_s": first.lower_bound_s,
            "batch": {**batch, "lengths": [int(x) for x in first.lengths]},
            "topology": topo.to_dict(), "cluster": profile.name, "model": model.name,
            "recompute": str(first.meta.recompute or "none"),
            "config": {"routing": args.routing, "remap": args.remap, "cp_size": args.cp_size,
                       "capacity_tokens": args.capacity_tokens, "tp": args.tp}}
