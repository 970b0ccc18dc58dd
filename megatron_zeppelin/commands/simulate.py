"""``zeppelin simulate``: plan one global batch and simulate one training iteration of the plan."""

from __future__ import annotations

import argparse
import json

from ..config import ROUTING, ZeppelinConfig
from ..errors import ZeppelinError
from ..sim.matrix import parse_tokens


def _tokens(x):
    try:
        return parse_tokens(x)
    except ZeppelinError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _tokens_or_memory(x):
    return "memory" if str(x).strip().lower() == "memory" else _tokens(x)


def add_parser(subparsers):
    from ..sim.runs import VARIANTS
    p = subparsers.add_parser(
        "simulate", help="simulate one training iteration of a planned batch",
        description="Plan one global batch (as `zeppelin plan`) and replay the plan's schedule on the "
                    "simulator: iteration time, per-rank timelines (Gantt PNG), per-NIC utilisation.")
    p.add_argument("--dataset", default="arxiv", help="preset (arxiv, github, prolong64k, ...) or a lengths file")
    p.add_argument("--cluster", default="a800", help="profile preset (a800, h800, h200; a/b/c) or a profile YAML")
    p.add_argument("--model", default="llama-7b", help="model preset (llama-3b/7b/13b/30b, tiny) or YAML")
    p.add_argument("--nodes", type=int, default=1, help="nodes in the domain (default 1)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size: the domain is one TP slice")
    p.add_argument("--capacity-tokens", "--zeppelin-capacity-tokens", type=_tokens_or_memory, default=0,
                   help="per-rank token capacity every strategy must fit: a count, or 'memory' (what one GPU "
                        "holds: ZeRO-1, no recompute, 90%% of the profile's memory_GB); 0 = the planner's default")
    p.add_argument("--global-batch-tokens", type=_tokens_or_memory, default=parse_tokens("1M"),
                   help="tokens in the global batch (1M, 512K, ...)")
    p.add_argument("--context-length", type=_tokens, default=parse_tokens("64K"),
                   help="longer documents are cut into pieces of this length (default 64K)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strategy", default="zeppelin", choices=VARIANTS,
                   help="a strategy, or an ablation step (static_cp+routing, zeppelin-noremap)")
    p.add_argument("--cp-size", type=int, default=0, help="CP size for static_cp/allgather_cp (0 = best)")
    p.add_argument("--routing", default="auto", choices=ROUTING, help="Zeppelin's routing layer")
    p.add_argument("--no-remap", dest="remap", action="store_false", help="Zeppelin without the remapping layer")
    p.add_argument("--sim-layers", default="scale", choices=("scale", "all"),
                   help="simulate one layer and scale (default), or chain every layer")
    p.add_argument("--overlap-grad-reduce", action="store_true",
                   help="overlap the DP all-reduce with the backward (Megatron DDP --overlap-grad-reduce)")
    p.add_argument("--remap-point", default="attention_output", choices=("attention_output", "core_attention"),
                   help="where the remap sits in the layer (default: after the output projection, as built)")
    p.add_argument("--gantt", metavar="FILE", help="write a Gantt PNG of one layer (forward, backward)")
    p.add_argument("--json", metavar="FILE", help="write the result (with the timeline) as JSON")
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from ..model_spec import load_model
    from ..profile import load_profile
    from ..sim.iteration import SimOptions, simulate
    from ..sim.runs import domain_topology, make_plan
    from ..workloads import describe_batch, sample_batch

    profile, model = load_profile(args.cluster), load_model(args.model)
    topo = domain_topology(profile, args.nodes, args.tp)
    cap, tokens = args.capacity_tokens, args.global_batch_tokens
    if "memory" in (cap, tokens):
        from ..sim.matrix import memory_tokens
        per_gpu, mem_cap = memory_tokens(args.cluster, args.model, args.tp, args.nodes)
        cap = mem_cap if cap == "memory" else cap
        tokens = per_gpu * topo.world_size if tokens == "memory" else tokens
        print(f"memory: {mem_cap} tokens fit one rank; batch {tokens} tokens, capacity {cap or 'default'}")
    config = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                            gpu_nic_map=topo.gpu_to_nic, cluster=args.cluster, routing=args.routing,
                            remap=args.remap, cp_size=args.cp_size, tp=args.tp, capacity_tokens=cap)
    lengths = sample_batch(args.dataset, tokens, args.seed, max_len=args.context_length or None)
    plan = make_plan(args.strategy, [int(x) for x in lengths], topo, profile, model, config)
    opts = SimOptions(layers=args.sim_layers, overlap_grad_reduce=args.overlap_grad_reduce,
                      remap_point=args.remap_point)
    res = simulate(plan, profile, model, tp=args.tp, options=opts)
    batch = describe_batch(lengths)
    print(f"{args.strategy} on {args.cluster}: {topo.describe()}, {args.model} (tp {args.tp}); "
          f"{args.dataset}: {batch.get('documents')} documents, {batch.get('tokens')} tokens")
    print(f"documents per class: {plan.class_counts()}   plan meta: {dict(plan.meta) or '-'}")
    print(f"simulated iteration  {res.iteration_s:10.4f} s   ({res.mode}: {res.layers} layers)")
    print(f"  forward            {res.forward_s:10.4f} s")
    print(f"  vocab head         {res.head_s:10.4f} s")
    print(f"  backward           {res.backward_s:10.4f} s")
    print(f"  DP all-reduce      {res.allreduce_exposed_s:10.4f} s exposed of {res.allreduce_s:.4f} s "
          f"({'overlapped with' if args.overlap_grad_reduce else 'after'} the backward)")
    print(f"planner prediction   {plan.predicted_iteration_s + res.allreduce_exposed_s:10.4f} s  "
          f"(plan {plan.predicted_iteration_s:.4f} + the same all-reduce)")
    lb = plan.lower_bound_s + res.allreduce_exposed_s
    print(f"lower bound          {lb:10.4f} s   simulated / lower bound = {res.iteration_s / lb:.3f}")
    busy = [sum(d.values()) for d in res.rank_compute_s]
    print(f"compute per rank     max {max(busy):.4f} s, mean {sum(busy) / len(busy):.4f} s "
          f"(max/mean {max(busy) / (sum(busy) / len(busy)):.3f})")
    print(f"bytes moved          NVLink {res.link_bytes.get('nvlink', 0) / 1e9:.2f} GB, "
          f"NIC {res.link_bytes.get('nic', 0) / 1e9:.2f} GB")
    if res.nic and topo.nodes > 1:
        u = [max(n["util_out"], n["util_in"]) for n in res.nic]
        print(f"NIC utilisation      max {max(u):.3f}, mean {sum(u) / len(u):.3f}, "
              f"used {sum(1 for n in res.nic if n['bytes_out'] > 0)} of {len(res.nic)} NICs")
    if args.gantt:
        from ..sim.plots import gantt
        try:
            gantt(res, args.gantt, title=f"{args.strategy}: {args.model} on {args.cluster}, {args.dataset}, "
                                         f"{topo.world_size} ranks; iteration {res.iteration_s:.3f} s")
        except OSError as e:
            raise ZeppelinError(f"cannot write --gantt {args.gantt}: {e.strerror}") from None
        print(f"wrote {args.gantt}")
    if args.json:
        doc = {"strategy": args.strategy, "cluster": args.cluster, "model": args.model, "tp": args.tp,
               "dataset": args.dataset, "nodes": args.nodes, "batch": batch, "plan_digest": plan.digest(),
               "predicted_iteration_s": plan.predicted_iteration_s, "lower_bound_s": plan.lower_bound_s,
               **res.to_dict(timeline=True)}
        try:
            with open(args.json, "w") as f:
                json.dump(doc, f, default=float)
        except OSError as e:
            raise ZeppelinError(f"cannot write --json {args.json}: {e.strerror}") from None
        print(f"wrote {args.json}")
    return 0
