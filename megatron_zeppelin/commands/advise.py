"""``zeppelin advise``: the Megatron configuration (TP/SP, CP or Zeppelin, micro-batch size and
gradient accumulation, DDP / distributed optimizer / Megatron-FSDP, recompute) for a model, cluster,
node count, dataset and fixed global batch, with the predicted time and memory per GPU, why, and one
complete Megatron flag line."""

from __future__ import annotations

import argparse
import json

from megatron_zeppelin.spec.token_counts import parse_tokens, token_count


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("advise", help="recommend TP/SP, CP or Zeppelin, micro-batch, ZeRO stage, recompute",
                              description="Plan a global micro-batch for every TP, strategy, CP and micro-batch "
                                          "size; predict time (simulator) and memory per GPU for every ZeRO stage "
                                          "and recompute level; pick, and print the Megatron flag line.")
    p.add_argument("--model", default="llama-7b", help="model preset or YAML")
    p.add_argument("--cluster", default="h200", help="profile preset (a800, h800, h200) or YAML")
    p.add_argument("--nodes", type=int, default=1, help="nodes in the job")
    p.add_argument("--dataset", default="prolong64k", help="length preset, distribution YAML or lengths file")
    p.add_argument("--gpu-memory", default=None, help="memory per GPU, e.g. 141GB (default: the profile's)")
    p.add_argument("--global-batch-tokens", type=token_count, default=parse_tokens("1M"),
                   help="tokens per global batch (a hyperparameter: never changed)")
    p.add_argument("--context-length", "--seq-length", dest="context_length", type=token_count,
                   default=parse_tokens("64K"), help="Megatron --seq-length; documents are cut to it")
    p.add_argument("--seed", type=int, default=0, help="batch sampler seed")
    p.add_argument("--no-sim", dest="sim", action="store_false", help="use the planner's prediction, not the simulator")
    p.add_argument("--json", default=None, help="also write every candidate to this JSON file")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from megatron_zeppelin.advise.recommend import DP_VARIANT, AdviseError, advise, parse_memory
    from megatron_zeppelin.advise.megatron_line import command_line
    from megatron_zeppelin.spec.model import load_model
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.data.workloads import sample_batch

    if args.nodes < 1:
        raise AdviseError(f"--nodes must be >= 1, got {args.nodes}")
    model, profile = load_model(args.model), load_profile(args.cluster)
    mem = parse_memory(args.gpu_memory) if args.gpu_memory else float(getattr(profile, "memory_GB", 80)) * 1e9
    lengths = sample_batch(args.dataset, args.global_batch_tokens, args.seed, args.context_length)
    a = advise(lengths, model, profile, args.nodes, mem, seq_length=args.context_length, use_sim=args.sim)
    gpn = profile.gpus_per_node
    print(f"{model.name} on {args.nodes} x {gpn} {profile.name} ({mem / 1e9:.0f} GB), {args.dataset}: "
          f"{len(lengths)} documents, {int(sum(lengths))} tokens per global batch "
          f"({int(sum(lengths)) // args.context_length} sequences of {args.context_length})")
    if a.best is None:
        print("no configuration fits:\n  " + "\n  ".join(a.reasons))
        return 1
    b = a.best
    seq = {"packed_dp": "packed DP (no CP)", "zeppelin": "Zeppelin (--zeppelin-balance)",
           "static_cp": f"Megatron CP {b.cp}", "hybrid_dp": "hybrid DP (Zeppelin engine)"}.get(b.strategy, b.strategy)
    print(f"recommend: TP {b.tp}{' + SP' if b.sp else ''}, {seq}, DP {b.dp}, micro-batch {b.mbs} x "
          f"{b.ga} accumulation steps, {DP_VARIANT[b.zero_stage]}, recompute {b.recompute.granularity}")
    print(f"predicted: {b.iteration_s * 1e3:.0f} ms per iteration ({b.compute_s * 1e3:.0f} compute + "
          f"{b.comm_exposed_s * 1e3:.0f} exposed DP communication), {b.tokens_per_s:,.0f} tokens/s, "
          f"{b.memory.total / 2**30:.1f} GiB per GPU")
    print("why:\n  " + "\n  ".join(a.reasons))
    print("megatron (add your --data-path / tokenizer / learning-rate flags in place of the last group):\n  "
          + command_line(b, model, args.nodes, gpn, args.context_length, int(sum(lengths)), profile.name,
                         profile.nics_per_node))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(a.to_dict(), f, indent=1)
    return 0
