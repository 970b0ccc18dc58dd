"""What ``zeppelin plan`` prints and writes: tables and the JSON document, read from Plans.

Nothing here computes a cost: times come from ``Plan.cost`` / ``lower_bound_s``, classes and
thresholds from the Plan, crossovers from the planner's CostModel, the routed-step comparison from
planner.routing.explain_step.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table

from megatron_zeppelin.planner.types import Plan
from megatron_zeppelin.spec.words import CLASSES, DocClass, Layout, Link


def _console(out) -> Console:
    return Console(file=out, width=132, color_system=None, highlight=False, soft_wrap=True)


def _table(*cols, title=None) -> Table:
    t = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False)
    for i, c in enumerate(cols):
        t.add_column(c, justify="left" if i == 0 else "right")
    return t


def _s(x: float) -> str:
    return f"{x:.4g}"


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


def print_plan(out, plan: Plan, max_ranks: int = 16, model=None, tp: int = 1, memory_GB: float = 0.0) -> None:
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
    _print_ranks(con, plan, max_ranks)
    lb = plan.lower_bound_s
    print(f"predicted iteration {plan.predicted_iteration_s:.4g} s; imbalance (max/mean) {plan.imbalance:.3f}; "
          f"lower bound {lb:.4g} s (perfect balance, communication hidden); "
          f"ratio to lower bound {plan.predicted_iteration_s / lb:.3f}", file=out)
    print(f"  both without the DP gradient all-reduce after the backward ({plan.allreduce_s:.4g} s, the same for "
          f"every strategy): {plan.predicted_with_allreduce_s:.4g} s with it", file=out)
    if model is not None:
        m = memory_balance(plan, model, tp)
        cap = (f"; planned within {plan.meta.token_cap} tokens per rank (--zeppelin-balance-memory)"
               if plan.meta.token_cap else "")
        over = (f"; more than a GPU's {memory_GB:g} GB alone (activation recompute, more GPUs or a smaller batch "
                "would fit it: zeppelin advise)" if memory_GB and m["max_bytes"] > memory_GB * 1e9 else "")
        print(f"activation memory per rank (peak, attention and linear layouts): max {m['max_bytes'] / 1e9:.2f} GB, "
              f"max/mean {m['imbalance']:.3f}{cap}{over}", file=out)
    nic = sum(o.nbytes for o in plan.schedule if o.link == Link.NIC)
    nvl = sum(o.nbytes for o in plan.schedule if o.link == Link.NVLINK)
    print(f"remap moves {remap_tokens(plan)} tokens; ring schedule: {len(plan.schedule)} ops, "
          f"{nvl / 1e6:.1f} MB over NVLink and {nic / 1e6:.1f} MB over NICs per layer forward", file=out)


def _rank_row(plan: Plan, r: int) -> List[str]:
    c = plan.cost[r]
    return [str(r), str(plan.topology.node_of(r)), str(plan.tokens(r)), str(plan.tokens(r, Layout.LINEAR)),
            _s(c.attention_s), _s(c.linear_s), _s(c.comm_exposed_s), _s(c.remap_s), _s(c.total_s)]


def _print_ranks(con: Console, plan: Plan, max_ranks: int) -> None:
    cols = ("rank", "node", "attn tokens", "linear tokens", "attention s", "linear s", "comm s", "remap s", "total s")
    world = plan.world_size
    if world <= max_ranks:
        t = _table(*cols, title="per-rank prediction (one iteration, fwd+bwd, all layers)")
        for r in range(world):
            t.add_row(*_rank_row(plan, r))
        con.print(t)
        return
    t = _table(*cols, title=f"per-rank prediction over {world} ranks (summary; worst ranks below)")
    m = np.array([[plan.tokens(r), plan.tokens(r, Layout.LINEAR), c.attention_s, c.linear_s, c.comm_exposed_s,
                   c.remap_s, c.total_s] for r, c in enumerate(plan.cost)])
    for name, f in (("min", np.min), ("mean", np.mean), ("max", np.max)):
        v = f(m, axis=0)
        t.add_row(name, "", f"{v[0]:.0f}", f"{v[1]:.0f}", *(_s(x) for x in v[2:]))
    worst = sorted(range(world), key=lambda r: (-plan.cost[r].total_s, r))[:3]
    for r in worst:
        t.add_row(*_rank_row(plan, r))
    con.print(t)


def print_compare(out, plans: Dict[str, object], cp_note: str = "", model=None, tp: int = 1) -> None:
    con = _console(out)
    z = plans.get("zeppelin")
    mem = ("memory imbalance",) if model is not None else ()
    t = _table("strategy", "iteration s", "imbalance", *mem, "x lower bound", "zeppelin speedup",
               "local/intra/inter", "cp size", title="all strategies on the same batch")
    missing = []
    for name, p in plans.items():
        if isinstance(p, str):
            t.add_row(name, "-", "-", *("-" for _ in mem), "-", "-", "-", "-")
            missing.append(f"  {name}: {p}")
            continue
        cc = p.class_counts()
        sp = f"{p.predicted_iteration_s / z.predicted_iteration_s:.2f}x" if isinstance(z, Plan) else "-"
        t.add_row(name, _s(p.predicted_iteration_s), f"{p.imbalance:.3f}",
                  *((f"{memory_balance(p, model, tp)['imbalance']:.3f}",) if mem else ()),
                  f"{p.predicted_iteration_s / p.lower_bound_s:.3f}", sp,
                  f"{cc['local']}/{cc['intra']}/{cc['inter']}", dict(p.meta).get("cp_size", "-"))
    con.print(t)
    for line in missing:
        print(line, file=out)
    print("zeppelin speedup = strategy's predicted iteration / zeppelin's; x lower bound = predicted / "
          "(perfectly balanced work, all communication hidden)"
          + ("; imbalance = max/mean per-rank time, memory imbalance = max/mean per-rank peak activation memory"
             if mem else ""), file=out)
    if cp_note:
        print(cp_note, file=out)


def seed_spread(per_seed, names) -> Dict[str, dict]:
    """Per strategy, over the batches of ``per_seed`` ([{strategy: Plan or reason}] one per seed): the
    predicted iteration, ratio to the lower bound and Zeppelin's speedup (mean, std, min, max)."""
    def stats(v):
        a = np.asarray(v, dtype=float)
        return {"mean": float(a.mean()), "std": float(a.std()), "min": float(a.min()), "max": float(a.max()),
                "n": int(a.size)} if a.size else None
    out = {}
    for n in names:
        ps = [d[n] for d in per_seed if isinstance(d[n], Plan)]
        zs = [d.get("zeppelin") for d in per_seed if isinstance(d[n], Plan)]
        sp = [p.predicted_iteration_s / z.predicted_iteration_s for p, z in zip(ps, zs) if isinstance(z, Plan)]
        out[n] = {"predicted_iteration_s": stats([p.predicted_iteration_s for p in ps]),
                  "ratio_to_lower_bound": stats([p.predicted_iteration_s / p.lower_bound_s for p in ps]),
                  "imbalance": stats([p.imbalance for p in ps]), "zeppelin_speedup": stats(sp),
                  "failed": len(per_seed) - len(ps)}
    return out


def print_spread(out, spread: Dict[str, dict], first: int, count: int) -> None:
    con = _console(out)
    t = _table("strategy", "iteration s mean", "std", "min", "max", "x lower bound mean", "zeppelin speedup mean",
               "speedup min-max", title=f"over {count} sampled batches (seeds {first}..{first + count - 1})")
    for n, r in spread.items():
        it, lb, sp = r["predicted_iteration_s"], r["ratio_to_lower_bound"], r["zeppelin_speedup"]
        if it is None:
            t.add_row(n, "-", "-", "-", "-", "-", "-", "-")
            continue
        t.add_row(n + (f" ({r['failed']} failed)" if r["failed"] else ""), _s(it["mean"]), _s(it["std"]),
                  _s(it["min"]), _s(it["max"]), f"{lb['mean']:.3f}",
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


def json_document(plans: Dict[str, object], main: Plan, batch: dict, topo, profile, model, args) -> dict:
    z = plans.get("zeppelin")
    strategies = {n: ({"error": p} if isinstance(p, str) else strategy_record(p, z, model, getattr(args, "tp", 1)))
                  for n, p in plans.items()}
    return {"strategies": strategies, "strategy": main.strategy,
            "thresholds": {"local_max": main.thresholds.local_max, "intra_max": main.thresholds.intra_max,
                           "reason": main.thresholds.reason},
            "lower_bound_s": main.lower_bound_s,
            "batch": {**batch, "lengths": [int(x) for x in main.lengths]},
            "topology": topo.to_dict(), "cluster": profile.name, "model": model.name,
            "config": {"routing": args.routing, "remap": args.remap, "cp_size": args.cp_size,
                       "capacity_tokens": args.capacity_tokens, "tp": args.tp}}
