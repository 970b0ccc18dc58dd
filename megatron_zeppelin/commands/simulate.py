"""``zeppelin simulate``: plan one global batch and simulate one training iteration of the plan
(``--compare``: every strategy on the same batch; ``--seeds N``: the mean and spread over N batches).

With ``--global-batch-size G --micro-batch-size M`` on R ranks an iteration is G / (M x R) steps, each a
global micro-batch sampled with the next seed, planned and simulated, then the DP all-reduce once
(sim/iteration.py ``accumulate``): the iteration Megatron logs; the mean step is printed beside it.
Zeppelin's steps get the iteration's documents packed as dynamic CP's rounds (``--zeppelin-accumulation
rounds``, the default), as sampled (``data_order``), or assigned jointly (``joint``, ``by_length``; or
``--strategy zeppelin+data_order`` / ``+joint`` / ``+by_length`` / ``+rounds``; planner/accumulation.py); the
baselines keep data order.
``--pipeline-stages N`` splits the nodes into N stages and runs the steps in 1F1B over them
(sim/iteration.py ``pipeline``), the bubble printed (flags/pipeline.py)."""

from __future__ import annotations

import json
import sys

from megatron_zeppelin.spec.config import ACCUMULATION, ROUTING, STRATEGIES, ZeppelinConfig
from megatron_zeppelin.flags.routing import add_relay_chunk_flag
from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.token_counts import token_count
from megatron_zeppelin.flags.domain import require_at_least
from megatron_zeppelin.flags.workload import add_tp_flag, add_workload_flags, counted_by, dataset_line, resolve_batch, tokenizer_from
from megatron_zeppelin.flags.memory import AUTO, add_memory_flags, memory_setup
from megatron_zeppelin.flags.output import check_output_paths
from megatron_zeppelin.flags.pipeline import add_pipeline_flag, pipeline_domain, pipeline_line

# What the output calls each strategy and ablation step (the --strategy values are the flags' words).
LABELS = {"zeppelin": "Zeppelin", "packed_dp": "packed DP", "static_cp": "static CP", "allgather_cp": "all-gather CP",
          "hybrid_dp": "hybrid DP/CP", "dynamic_cp": "dynamic CP", "static_cp+routing": "static CP + routing",
          "zeppelin-noremap": "Zeppelin, no remap", "zeppelin+joint": "Zeppelin, joint accumulation",
          "zeppelin+by_length": "Zeppelin, accumulation by length",
          "zeppelin+rounds": "Zeppelin, accumulation in rounds",
          "zeppelin+data_order": "Zeppelin, accumulation in data order"}


def _tokens_or_memory(x):
    return "memory" if str(x).strip().lower() == "memory" else token_count(x)


def add_parser(subparsers):
    from megatron_zeppelin.sim.runs import VARIANTS
    p = subparsers.add_parser(
        "simulate", help="simulate one training iteration of a planned batch",
        description="Plan one global batch (as `zeppelin plan`) and replay the plan's schedule on the "
                    "simulator: iteration time, per-rank timelines (Gantt PNG), per-NIC utilisation.")
    add_workload_flags(p, batch_type=_tokens_or_memory)
    p.add_argument("--cluster", default="h200", help="profile preset (a800, h800, h200; a/b/c) or a profile YAML "
                   "(default h200, as plan, train, advise and the Megatron-LM entry's --zeppelin-cluster)")
    p.add_argument("--model", default="llama-7b", help="model preset (llama-3b/7b/13b/30b, tiny) or YAML")
    p.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    add_tp_flag(p)
    add_pipeline_flag(p)
    p.add_argument("--capacity-tokens", "--zeppelin-capacity-tokens", type=_tokens_or_memory, default=0,
                   help="per-rank token capacity every strategy must fit: a count, or 'memory' (what one GPU "
                        "holds: ZeRO-1, no recompute, 90%% of the profile's memory_GB); 0 = the planner's default")
    p.add_argument("--strategy", default="zeppelin", choices=VARIANTS,
                   help="a strategy, or an ablation step (static_cp+routing, zeppelin-noremap), or "
                        "zeppelin+data_order / zeppelin+joint / zeppelin+by_length / zeppelin+rounds (Zeppelin with "
                        "--zeppelin-accumulation data_order / joint / by_length / rounds)")
    p.add_argument("--accumulation", "--zeppelin-accumulation", default="rounds", choices=ACCUMULATION,
                   help="with several steps: Zeppelin's documents packed as Megatron's dynamic-CP scheduler packs "
                        "its rounds (rounds, the default), as sampled per step (data_order), or assigned to the "
                        "steps jointly, each of like work (joint) or like documents together (by_length; "
                        "planner/accumulation.py); baselines keep data order")
    p.add_argument("--compare", action="store_true", help="simulate every strategy on the same batch")
    p.add_argument("--cp-size", type=int, default=0, help="CP size for static_cp/allgather_cp (0 = best predicted)")
    p.add_argument("--routing", default="auto", choices=ROUTING, help="Zeppelin's routing layer")
    add_relay_chunk_flag(p)
    p.add_argument("--no-remap", dest="remap", action="store_false", help="Zeppelin without the remapping layer")
    add_memory_flags(p)
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


def describe_choice(meta: dict) -> str:
    """A baseline's run-level choices in words (e.g. the CP size it was planned with); internal
    bookkeeping of the planner (its variant, budgets) is left out."""
    parts = []
    for key, val in meta.items():
        if key.endswith("_predicted_s") or key not in ("cp_size", "dp_size") and f"{key}_predicted_s" not in meta:
            continue
        if key == "dp_size":
            parts.append(f"{val} data-parallel replica(s)")
            continue
        name = key.replace("_", " ").replace("cp ", "CP ")
        if f"{key}_predicted_s" not in meta:  # a run-level value fixed before planning (deployed)
            parts.append(f"{name} {val}")
            continue
        tried = ", ".join(f"{lb} {float(t):.4g} s" for lb, t in
                          (x.strip().split(":") for x in meta[f"{key}_predicted_s"].split(",")))
        parts.append(f"{name} {val} (the fastest predicted for this batch of {name} {tried})")
    return "; ".join(parts)


def _simulate_one(variant, lengths, topo, profile, model, config, args):
    from megatron_zeppelin.sim.iteration import SimOptions, simulate
    from megatron_zeppelin.sim.runs import make_plan
    plan = make_plan(variant, [int(x) for x in lengths], topo, profile, model, config)
    opts = SimOptions(layers=args.sim_layers, overlap_grad_reduce=args.overlap_grad_reduce,
                      remap_point=args.remap_point)
    return plan, simulate(plan, profile, model, tp=args.tp, options=opts)


def _run_batch(variants, step_lengths, topo, profile, model, config, args) -> dict:
    """{variant: (Iteration of the steps' plans, the iteration's SimResult)} or {variant: reason} where
    it cannot be planned (--compare only). ``step_lengths``: one batch per gradient-accumulation step."""
    from megatron_zeppelin.planner.iteration import Iteration
    from megatron_zeppelin.sim.iteration import pipeline
    from megatron_zeppelin.planner.accumulation import joint_steps
    from megatron_zeppelin.sim.runs import regrouping
    out = {}
    stages = getattr(args, "pipeline_stages", 1) or 1  # 1F1B over the stages (accumulate with one)
    for v in variants:
        try:
            v_lengths, v_config = step_lengths, config
            how = regrouping(v, config)
            if len(step_lengths) > 1 and how is not None:
                v_lengths, v_config = joint_steps([[int(x) for x in ls] for ls in step_lengths], topo, profile,
                                                  model, config, how, stages)
            steps = [_simulate_one(v, lengths, topo, profile, model, v_config, args) for lengths in v_lengths]
        except ZeppelinError as e:
            if v == args.strategy:
                raise
            out[v] = str(e)
            continue
        out[v] = (Iteration(tuple(p for p, _ in steps), stages=stages), pipeline([r for _, r in steps], stages))
    return out


def run(args) -> int:
    from megatron_zeppelin.spec.model import load_model
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.data.workloads import describe_batch, describe_source, load_source, sample_batch
    from megatron_zeppelin.reports import simulate as report

    check_output_paths((("--json", args.json), ("--gantt", args.gantt)))  # before any sampling or planning
    profile, model = load_profile(args.cluster), load_model(args.model)
    dom, stages = pipeline_domain(args, profile, model)  # with stages: one stage's DP ranks
    require_at_least(args, (("cp_size", "--cp-size", 0),))
    topo = dom.topology
    b = resolve_batch(args, topo.world_size)
    cap, tokens = b.capacity, b.tokens
    if "memory" in (cap, tokens):
        from megatron_zeppelin.sim.matrix import memory_tokens
        recompute = "none" if args.recompute == AUTO else args.recompute
        per_gpu, mem_cap = memory_tokens(args.cluster, args.model, args.tp, args.nodes, recompute=recompute)
        cap = mem_cap if cap == "memory" else cap
        tokens = per_gpu * topo.world_size if tokens == "memory" else tokens
        mem_note = (f"memory: {mem_cap} tokens fit one rank (recompute {recompute}); batch {tokens} tokens, capacity "
                    f"{cap or 'default'}")
    else:
        given = any(getattr(args, a, None) is not None for a in ("global_batch_tokens", "global_batch_size",
                                                                  "micro_batch_size"))
        mem = memory_setup(args.recompute, model, profile, topo, args.tp, tokens, given, cap)
        recompute, cap, tokens, mem_note = mem.recompute, mem.capacity, mem.tokens, mem.note
    tokenizer = tokenizer_from(args)
    source = load_source(args.dataset, tokenizer=tokenizer)
    config = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                            gpu_nic_map=topo.gpu_to_nic, cluster=args.cluster, routing=args.routing,
                            remap=args.remap, cp_size=args.cp_size, tp=args.tp, capacity_tokens=cap,
                            recompute=recompute, accumulation=args.accumulation,
                            relay_chunk_bytes=args.relay_chunk_bytes)
    variants = tuple(dict.fromkeys((args.strategy,) + (STRATEGIES if args.compare else ())))
    k = b.steps  # gradient-accumulation steps: iteration i samples seeds seed + i*k .. seed + i*k + k - 1
    batches = []
    for first in range(args.seed, args.seed + args.seeds * k, k):
        step_lengths = [sample_batch(source, tokens, first + j, max_len=args.context_length or None) for j in range(k)]
        batches.append((step_lengths[0], _run_batch(variants, step_lengths, topo, profile, model, config, args)))
    lengths, results = batches[0]
    it, res = results[args.strategy]
    plan = it.first
    batch = describe_batch(lengths)
    out = sys.stdout
    print(dataset_line(args.dataset, describe_source(source), counted_by(args.dataset, tokenizer)), file=out)
    print(f"batch (seed {args.seed}): {batch['documents']} documents, {batch['tokens']} tokens; length min "
          f"{batch['min']} / median {batch['median']:.0f} / max {batch['max']}", file=out)
    print(f"GPUs: {dom.describe()}; cluster {profile.name}, model {model.name}", file=out)
    if b.note:
        print(f"batch size: {b.note}", file=out)
    print(mem_note, file=out)
    report.print_detail(out, LABELS[args.strategy], it, res, describe_choice(dict(plan.meta)), args)
    if stages > 1:  # the last stage is the busiest: its share of every layer, and the vocab head
        print(pipeline_line(stages, k, topo.world_size, res.iteration_s,
                            (res.forward_s + res.backward_s) / stages + res.head_s, res.allreduce_exposed_s), file=out)
    if args.compare:
        report.print_compare(out, results, LABELS, args.cp_size)
    spread = report.seed_spread([r for _, r in batches], variants) if args.seeds > 1 else None
    if spread:
        report.print_spread(out, spread, LABELS, args.seed, args.seeds, k)
    if args.gantt:
        from megatron_zeppelin.plots.matrix import gantt
        try:
            gantt(res, args.gantt, title=f"{LABELS[args.strategy]}: {args.model} on {args.cluster}, {args.dataset}, "
                                         f"{topo.world_size} ranks; iteration {res.iteration_s:.3f} s")
        except OSError as e:
            raise ZeppelinError(f"cannot write --gantt {args.gantt}: {e.strerror}") from None
        print(f"wrote {args.gantt}", file=out)
    if args.json:
        doc = {"strategy": args.strategy, "cluster": args.cluster, "model": args.model, "tp": args.tp,
               "dataset": args.dataset, "nodes": args.nodes, "gpus": dom.gpus, "batch": batch,
               "plan_digest": plan.digest(), "plan_choice": describe_choice(dict(plan.meta)),
               "predicted_iteration_s": report.planner_s(it, res), "pipeline_stages": stages,
               "lower_bound_s": report.lower_bound(it, res), "recompute": recompute, "steps": k,
               "step_digests": [p.digest() for p in it.steps],
               "predicted_step_s": [p.predicted_iteration_s for p in it.steps], **res.to_dict(timeline=True)}
        if args.compare:
            doc["compare"] = report.compare_records(results)
        if spread:
            doc["seeds"] = {"first": args.seed, "count": args.seeds, "steps_per_iteration": k, "strategies": spread}
        try:
            with open(args.json, "w") as f:
                json.dump(doc, f, default=float)
        except OSError as e:
            raise ZeppelinError(f"cannot write --json {args.json}: {e.strerror}") from None
        print(f"wrote {args.json}", file=out)
    return 0

