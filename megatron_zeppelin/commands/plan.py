"""``zeppelin plan``: plan one global batch and show what each rank is predicted to do.

Everything printed comes from the Plan's own fields (costs, thresholds, lower bound) or from the
planner's cost model (the crossovers of ``--explain``); the CLI computes no costs of its own.
Token counts take K/M suffixes (token_counts.parse_tokens, one parser for every command).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, Optional

import numpy as np

from megatron_zeppelin.spec.config import ACCUMULATION, ROUTING, STRATEGIES, ZeppelinConfig
from megatron_zeppelin.flags.routing import add_relay_chunk_flag
from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.token_counts import token_count
from megatron_zeppelin.data.workloads import describe_batch, describe_source, load_source, sample_batch
from megatron_zeppelin.reports import plan as report
from megatron_zeppelin.flags.domain import Domain, require_at_least
from megatron_zeppelin.flags.workload import add_tp_flag, add_workload_flags, counted_by, dataset_line, resolve_batch, tokenizer_from
from megatron_zeppelin.flags.memory import add_memory_flags, memory_setup
from megatron_zeppelin.flags.output import check_output_paths
from megatron_zeppelin.flags.pipeline import add_pipeline_flag, pipeline_domain, pipeline_line
from megatron_zeppelin.planner.accumulation import ASSIGNING, JOINT_STRATEGIES, joint_steps
from megatron_zeppelin.planner.iteration import Iteration


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "plan", help="plan one global batch and print per-rank predictions",
        description="Plan one global batch with Zeppelin (or a baseline) and print documents per class, "
                    "thresholds, per-rank predicted times, imbalance, the lower bound and whether it fits a "
                    "GPU's memory; with --global-batch-size G --micro-batch-size M the iteration is G / (M x "
                    "ranks) planned steps (global micro-batches sampled with successive seeds) and the DP "
                    "all-reduce, as Megatron logs it.")
    g = p.add_argument_group("workload")
    add_workload_flags(g)
    g = p.add_argument_group("machine and model")
    g.add_argument("--cluster", "--zeppelin-cluster", default="h200",
                   help="profile preset (a800, h800, h200; a/b/c) or a profile YAML (default h200, as train, advise "
                        "and the Megatron-LM entry's --zeppelin-cluster)")
    g.add_argument("--model", default="llama-7b", help="model preset (llama-3b/7b/13b/30b, tiny) or YAML")
    g.add_argument("--nodes", type=int, default=None, help="nodes (default 1)")
    g.add_argument("--world-size", type=int, default=None, help="GPUs in the job, as Megatron's WORLD_SIZE "
                   "(instead of --nodes)")
    g.add_argument("--gpus-per-node", "--zeppelin-gpus-per-node", type=int, default=None,
                   help="GPUs per node (default: the profile's)")
    g.add_argument("--nics-per-node", "--zeppelin-nics-per-node", type=int, default=None,
                   help="NICs per node (default: the profile's)")
    add_tp_flag(g)
    add_pipeline_flag(g)
    g = p.add_argument_group("planner")
    g.add_argument("--strategy", "--zeppelin-strategy", default="zeppelin", choices=STRATEGIES,
                   help="strategy to show in detail (default zeppelin)")
    g.add_argument("--compare", action="store_true", help="plan every strategy on the same batch")
    g.add_argument("--cp-size", "--zeppelin-cp-size", type=int, default=0,
                   help="CP group size for static_cp / allgather_cp (0 = best for the batch)")
    g.add_argument("--routing", "--zeppelin-routing", default="auto", choices=ROUTING,
                   help="route inter-node ring messages over all NICs (auto: when the domain spans nodes)")
    add_relay_chunk_flag(g)
    g.add_argument("--no-remap", "--no-zeppelin-remap", dest="remap", action="store_false",
                   help="keep the attention layout for the linear modules (no remapping layer)")
    g.add_argument("--capacity-tokens", "--zeppelin-capacity-tokens", type=token_count, default=0,
                   help="per-rank attention-token capacity (0 = 2x the mean tokens per rank)")
    g.add_argument("--balance-memory", "--zeppelin-balance-memory", action="store_true",
                   help="plan Zeppelin with every rank within 1.10x the mean tokens (balanced activation "
                        "memory, for some predicted time and planning time)")
    g.add_argument("--accumulation", "--zeppelin-accumulation", default="rounds", choices=ACCUMULATION,
                   help="with several steps: assign the iteration's documents to its steps first, packed as "
                        "Megatron's dynamic-CP scheduler packs its rounds (rounds, the default), each of like "
                        "work (joint) or like documents together (by_length), or plan each step's documents as "
                        "sampled (data_order); Zeppelin only, planner/accumulation.py")
    add_memory_flags(g)
    g = p.add_argument_group("output")
    g.add_argument("--json", metavar="FILE", help="write the results as JSON")
    g.add_argument("--plot", metavar="FILE", help="write a PNG: length histogram and per-rank bars")
    g.add_argument("--explain", action="store_true", help="print why the thresholds are what they are")
    g.add_argument("--ranks", type=int, default=16, help="print every rank up to this many, else a summary")
    g.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    p.set_defaults(func=run)
    return p


def make_plans(lengths, topo, profile, model, config, names) -> Dict[str, object]:
    """{strategy: Plan, or a string saying why there is none}. The batch is checked once first, so a
    bad batch is one clear error rather than one per strategy."""
    from megatron_zeppelin.planner import check_lengths, make_context, plan_batch
    ctx = make_context(topo, profile, model, config, total_tokens=int(np.sum(lengths)))
    check_lengths(lengths, ctx.capacity, topo.world_size)
    out = {}
    for name in names:
        try:
            out[name] = plan_batch(lengths, topo, profile, model, config, strategy=name)
        except ModuleNotFoundError as e:
            if not (e.name or "").startswith("megatron_zeppelin."):
                raise
            out[name] = f"not available in this installation ({e.name} missing)"
        except ZeppelinError as e:
            if len(names) == 1:
                raise
            out[name] = f"cannot plan: {e}"
    return out


def _batch_given(args) -> bool:
    """Whether the user set the batch (else the default batch, which memory may shrink)."""
    return any(getattr(args, a, None) is not None for a in ("global_batch_tokens", "global_batch_size",
                                                             "micro_batch_size"))


def plan_iteration(source, tokens: int, first_seed: int, steps: int, context_length: int, plan_lengths, names,
                   regroup=None, stages: int = 1):
    """One iteration's steps, each a global micro-batch sampled with the next seed (``first_seed`` ..
    ``first_seed + steps - 1``): (the lengths of each step, {strategy: Iteration, or why not}).
    ``regroup``: {strategy: (step lengths -> (the steps' lengths to plan, the plan_lengths to plan
    them with))} for the strategies whose documents are assigned to the steps jointly. ``stages``:
    pipeline stages, the steps in 1F1B over them (planner/iteration.py)."""
    regroup = regroup or {}
    sampled = [sample_batch(source, tokens, first_seed + j, max_len=context_length or None) for j in range(steps)]
    groups = [(tuple(n for n in names if n not in regroup), [s.tolist() for s in sampled], plan_lengths)]
    for n, f in regroup.items():
        groups.append(((n,), *f([s.tolist() for s in sampled])))
    out = {}
    for group, step_lists, plan in groups:
        if not group:
            continue
        per_step = [plan(ls, group) for ls in step_lists]
        for n in group:
            ps = [plans[n] for plans in per_step]
            out[n] = next((p for p in ps if isinstance(p, str)), None) or Iteration(tuple(ps), stages=stages)
    return sampled, {n: out[n] for n in names}


def run(args) -> int:
    check_output_paths((("--json", args.json), ("--plot", args.plot)))  # before any sampling or planning
    profile = load_profile(args.cluster)
    model = load_model(args.model)
    dom, stages = pipeline_domain(args, profile, model)  # with stages: one stage's DP ranks
    require_at_least(args, (("ranks", "--ranks", 1), ("cp_size", "--cp-size", 0)))
    topo = dom.topology
    batch_flags = resolve_batch(args, topo.world_size)
    mem = memory_setup(args.recompute, model, profile, topo, args.tp, batch_flags.tokens, _batch_given(args),
                       batch_flags.capacity)
    tokenizer = tokenizer_from(args)
    config = ZeppelinConfig(strategy=args.strategy, gpus_per_node=topo.gpus_per_node,
                            nics_per_node=topo.nics_per_node, gpu_nic_map=topo.gpu_to_nic,
                            cluster=args.cluster, routing=args.routing, remap=args.remap,
                            capacity_tokens=mem.capacity, cp_size=args.cp_size, tp=args.tp,
                            balance_memory=args.balance_memory, recompute=mem.recompute,
                            accumulation=args.accumulation,
                            relay_chunk_bytes=args.relay_chunk_bytes)
    source = load_source(args.dataset, tokenizer=tokenizer)
    names = STRATEGIES if args.compare else (args.strategy,)
    steps = batch_flags.steps

    def plan_with(cfg):
        return lambda ls, ns: make_plans(ls, topo, profile, model, cfg, ns)

    def joint(step_lists):  # the steps' documents assigned jointly, planned with the capacity it keeps
        lists, cfg = joint_steps(step_lists, topo, profile, model, config, stages=stages)
        return lists, plan_with(cfg)
    regroup = ({n: joint for n in names if n in JOINT_STRATEGIES}
               if config.accumulation in ASSIGNING and steps > 1 else {})

    def one(first_seed):
        return plan_iteration(source, mem.tokens, first_seed, steps, args.context_length, plan_with(config), names,
                              regroup, stages)
    step_lengths, iterations = one(args.seed)
    lengths = step_lengths[0]
    main = iterations[args.strategy]
    if isinstance(main, str):
        raise ZeppelinError(f"strategy {args.strategy} {main}; choose another --strategy")
    batch = {"dataset": args.dataset, "seed": args.seed, "context_length": args.context_length,
             **describe_batch(lengths)}
    stats = describe_source(source)
    spread = None
    if args.seeds > 1:  # the first iteration is shown in detail; the others only enter the spread
        per_seed = [iterations] + [one(args.seed + i * steps)[1] for i in range(1, args.seeds)]
        spread = report.seed_spread(per_seed, names)
    out = sys.stdout
    print(dataset_line(args.dataset, stats, counted_by(args.dataset, tokenizer)), file=out)
    report.print_header(out, batch, topo, profile, model, args, dom)
    if batch_flags.note:
        print(f"batch size: {batch_flags.note}", file=out)
    print(mem.note, file=out)
    report.print_plan(out, main, args.ranks, model, args.tp, mem, args.seed)
    if stages > 1:
        print(pipeline_line(stages, len(main.steps), topo.world_size, main.predicted_iteration_s,
                            main.steps_s / stages, main.allreduce_s), file=out)
    shown = next((n for n in regroup if isinstance(iterations[n], Iteration)), None)
    if shown:
        print(f"accumulation {config.accumulation.value}: {', '.join(regroup)}'s documents of the {steps} steps "
              "assigned to them jointly "
              f"(planner/accumulation.py): tokens per step "
              f"{', '.join(str(sum(p.lengths)) for p in iterations[shown].steps)} "
              f"(sampled: {', '.join(str(int(sum(x))) for x in step_lengths)}); other strategies in data order",
              file=out)
    if args.compare:
        report.print_compare(out, iterations, report.per_batch_note(args.cp_size), model, args.tp, mem)
    if spread:
        report.print_spread(out, spread, args.seed, args.seeds, steps)
        if not args.compare and args.strategy in ("static_cp", "allgather_cp") and report.per_batch_note(args.cp_size):
            print(report.per_batch_note(args.cp_size), file=out)
    if args.explain:
        report.print_explain(out, main.first, lengths, topo, profile, model, config)
    if args.json:
        doc = report.json_document(iterations, main, batch, topo, profile, model, args, mem)
        doc["dataset"] = stats
        doc["gpus"] = {"total": dom.gpus * stages, "gpus_per_node": dom.gpus_per_node, "tp": dom.tp,
                       "domain_ranks": topo.world_size}
        if stages > 1:
            doc["pipeline"] = {"stages": stages, "micro_batches": len(main.steps),
                               "iteration_s": main.predicted_iteration_s, "stage_work_s": main.steps_s / stages,
                               "bubble_s": main.pipeline_s - main.steps_s / stages}
        if spread:
            doc["seeds"] = {"first": args.seed, "count": args.seeds, "steps_per_iteration": steps,
                            "strategies": spread}
        try:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
        except OSError as e:
            raise ZeppelinError(f"cannot write --json {args.json}: {e.strerror}") from None
        print(f"wrote {args.json}", file=out)
    if args.plot:
        from megatron_zeppelin.plots.plan import plot_plan  # lazy: matplotlib is slow to import
        try:
            plot_plan(args.plot, lengths, main.first, iterations if args.compare else None,
                      title=_title(batch, dom, args), iteration=main)
        except OSError as e:
            raise ZeppelinError(f"cannot write --plot {args.plot}: {e.strerror}") from None
        print(f"wrote {args.plot}", file=out)
    return 0


def _title(batch: dict, dom: Domain, args) -> Optional[str]:
    t = dom.topology
    return (f"{batch['dataset']}: {batch['documents']} documents, {batch['tokens']} tokens; "
            f"{args.model} on {args.cluster}, {t.nodes}x{dom.gpus_per_node} GPUs"
            + (f", TP {dom.tp}" if dom.tp > 1 else ""))
