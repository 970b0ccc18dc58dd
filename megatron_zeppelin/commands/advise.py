"""``zeppelin advise``: recommend the DP variant, ZeRO stage, TP size and Zeppelin/CP use, with the
predicted memory per GPU and throughput, and why."""

from __future__ import annotations

import argparse
import json

from ..token_counts import parse_tokens, token_count


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("advise", help="recommend DP variant, ZeRO stage, TP and Zeppelin/CP",
                              description="Plan a sampled batch for every TP size and strategy, predict time "
                                          "(simulator) and memory per GPU for every ZeRO stage, and pick.")
    p.add_argument("--model", default="llama-7b", help="model preset or YAML")
    p.add_argument("--cluster", default="h200", help="profile preset (a800, h800, h200; a/b/c) or YAML")
    p.add_argument("--nodes", type=int, default=1, help="nodes in the job")
    p.add_argument("--dataset", default="prolong64k", help="length preset, distribution YAML or lengths file")
    p.add_argument("--gpu-memory", default=None, help="memory per GPU, e.g. 141GB (default: the profile's)")
    p.add_argument("--global-batch-tokens", type=token_count, default=parse_tokens("1M"), help="tokens per global batch")
    p.add_argument("--context-length", type=token_count, default=parse_tokens("64K"), help="documents cut to this length")
    p.add_argument("--seed", type=int, default=0, help="batch sampler seed")
    p.add_argument("--no-sim", dest="sim", action="store_false", help="use the planner's prediction, not the simulator")
    p.add_argument("--json", default=None, help="also write every candidate to this JSON file")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from ..advise import DP_VARIANT, AdviseError, advise, parse_memory
    from ..model_spec import load_model
    from ..profile import load_profile
    from ..workloads import sample_batch

    if args.nodes < 1:
        raise AdviseError(f"--nodes must be >= 1, got {args.nodes}")
    model, profile = load_model(args.model), load_profile(args.cluster)
    mem = parse_memory(args.gpu_memory) if args.gpu_memory else float(getattr(profile, "memory_GB", 80)) * 1e9
    lengths = sample_batch(args.dataset, args.global_batch_tokens, args.seed, args.context_length)
    a = advise(lengths, model, profile, args.nodes, mem, use_sim=args.sim)
    print(f"{model.name} on {args.nodes} x {profile.gpus_per_node} {profile.name}, {args.dataset}: "
          f"{len(lengths)} documents, {int(sum(lengths))} tokens per global batch")
    if a.best is None:
        print("no configuration fits:\n  " + "\n  ".join(a.reasons))
        return 1
    b = a.best
    print(f"recommend: TP {b.tp}, {DP_VARIANT[b.zero_stage]}, sequence strategy {b.strategy}"
          + (" (--zeppelin-balance)" if b.strategy == "zeppelin" else "")
          + (", full activation recompute" if b.recompute else ""))
    print(f"predicted: {b.iteration_s * 1e3:.0f} ms per iteration, {b.tokens_per_s:,.0f} tokens/s, "
          f"{b.memory.total / 2**30:.1f} GiB per GPU")
    print("why:\n  " + "\n  ".join(a.reasons))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(a.to_dict(), f, indent=1)
    return 0
