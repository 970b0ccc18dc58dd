"""``zeppelin advise``: the Megatron configuration (TP/SP, CP or Zeppelin, micro-batch size and
gradient accumulation, DDP / distributed optimizer / Megatron-FSDP, recompute) for a model, cluster,
node count, dataset and fixed global batch, with the predicted time and memory per GPU, why, and one
complete Megatron flag line."""

from __future__ import annotations

import argparse
import json

from megatron_zeppelin.flags.workload import add_tp_flag, add_workload_flags


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("advise", help="recommend TP/SP, CP or Zeppelin, micro-batch, ZeRO stage, recompute",
                              description="Plan a global micro-batch for every TP, strategy, CP size or per-rank "
                                          "share and micro-batch size; predict time (simulator) and memory per GPU "
                                          "for every ZeRO stage and recompute level; pick, and print the Megatron "
                                          "flag line. The global batch and --seq-length (the context: the longest "
                                          "document) are hyperparameters advise never changes.")
    g = p.add_argument_group("workload (as plan and simulate take them)")
    add_workload_flags(g, spread=False)
    g = p.add_argument_group("machine and model")
    g.add_argument("--model", default="llama-7b", help="model preset or YAML")
    g.add_argument("--cluster", default="h200", help="profile preset (a800, h800, h200) or YAML")
    g.add_argument("--nodes", type=int, default=1, help="nodes in the job")
    g.add_argument("--gpu-memory", default=None, help="memory per GPU, e.g. 141GB (default: the profile's)")
    add_tp_flag(g, default=None, help="only this tensor-parallel size (default: every TP of 1, 2, 4, 8 that "
                                      "divides the heads and a node)")
    g = p.add_argument_group("output")
    g.add_argument("--no-sim", dest="sim", action="store_false", help="use the planner's prediction, not the simulator")
    g.add_argument("--json", default=None, help="also write every candidate to this JSON file")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from megatron_zeppelin.advise.recommend import DP_VARIANT, AdviseError, advise, parse_memory
    from megatron_zeppelin.advise.megatron_line import command_line
    from megatron_zeppelin.spec.megatron_flags import DATA_PLACEHOLDER
    from megatron_zeppelin.spec.model import load_model
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.data.workloads import describe_source, load_source, sample_batch
    from megatron_zeppelin.flags.domain import require_at_least
    from megatron_zeppelin.flags.workload import counted_by, dataset_line, tokenizer_from, whole_batch_tokens

    require_at_least(args, (("nodes", "--nodes", 1), ("tp", "--tp/--tensor-model-parallel-size", 1),
                            ("micro_batch_size", "--micro-batch-size", 1), ("seed", "--seed", 0)))
    if not args.context_length:
        raise AdviseError("--seq-length must be > 0 (the context: the longest document, which advise never changes)")
    model, profile = load_model(args.model), load_profile(args.cluster)
    if args.tp and (model.heads % args.tp or model.kv_heads % args.tp or profile.gpus_per_node % args.tp):
        raise AdviseError(f"--tp {args.tp} must divide {model.name}'s {model.heads} heads, {model.kv_heads} KV heads "
                          f"and the {profile.gpus_per_node} GPUs of a node")
    mem = parse_memory(args.gpu_memory) if args.gpu_memory else float(getattr(profile, "memory_GB", 80)) * 1e9
    tokens, batch_note = whole_batch_tokens(args)
    tokenizer = tokenizer_from(args)
    source = load_source(args.dataset, tokenizer=tokenizer)
    lengths = sample_batch(source, tokens, args.seed, args.context_length)
    a = advise(lengths, model, profile, args.nodes, mem, seq_length=args.context_length, use_sim=args.sim,
               tps=[args.tp] if args.tp else None,
               micro_batch_sizes=(args.micro_batch_size,) if args.micro_batch_size else None)
    gpn = profile.gpus_per_node
    print(dataset_line(args.dataset, describe_source(source), counted_by(args.dataset, tokenizer)))
    print(f"{model.name} on {args.nodes} x {gpn} {profile.name} ({mem / 1e9:.0f} GB), {args.dataset}: "
          f"{len(lengths)} documents, {int(sum(lengths))} tokens per global batch ({batch_note}; documents cut at "
          f"the context --seq-length {args.context_length})")
    if a.best is None:
        print("no configuration fits:\n  " + "\n  ".join(a.reasons))
        return 1
    b = a.best
    seq = {"packed_dp": "packed DP (no CP)" + (", documents whole (Zeppelin entry)" if b.zeppelin_entry else ""),
           "zeppelin": "Zeppelin (--zeppelin-balance)",
           "static_cp": f"Megatron CP {b.cp}", "hybrid_dp": "hybrid DP (Zeppelin engine)"}.get(b.strategy, b.strategy)
    share = f", share {b.share} tokens per rank" if b.zeppelin_entry else ""
    print(f"recommend: TP {b.tp}{' + SP' if b.sp else ''}, {seq}, DP {b.dp}{share}, micro-batch {b.mbs} x "
          f"{b.ga} accumulation steps, {DP_VARIANT[b.zero_stage]}, recompute {b.recompute.granularity}")
    print(f"predicted: {b.iteration_s * 1e3:.0f} ms per iteration ({b.compute_s * 1e3:.0f} compute + "
          f"{b.comm_exposed_s * 1e3:.0f} exposed DP communication), {b.tokens_per_s:,.0f} tokens/s, "
          f"{b.memory.total / 2**30:.1f} GiB per GPU")
    print("why:\n  " + "\n  ".join(a.reasons))
    line = command_line(b, model, args.nodes, gpn, args.context_length, int(sum(lengths)), profile.name,
                        profile.nics_per_node)
    print(f"megatron (put your indexed dataset in place of {DATA_PLACEHOLDER}, and your tokenizer and learning-rate "
          f"flags in place of the last group):\n  " + line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(a.to_dict(), f, indent=1)
    return 0
