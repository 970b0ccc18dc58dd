"""``zeppelin plan``: plan one global batch and show what each rank is predicted to do.

Everything printed comes from the Plan's own fields (costs, thresholds, lower bound) or from the
planner's cost model (the crossovers of ``--explain``); the CLI computes no costs of its own.

>>> parse_tokens("64K"), parse_tokens("1M"), parse_tokens("1.5k"), parse_tokens("4096")
(65536, 1048576, 1536, 4096)
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, Optional

import numpy as np

from ..config import ROUTING, STRATEGIES, ZeppelinConfig
from ..errors import ZeppelinError
from ..model_spec import load_model
from ..profile import load_profile
from ..topology import Topology
from ..workloads import PRESETS, describe_batch, sample_batch
from . import plan_report as report

_SUFFIX = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_tokens(text: str) -> int:
    """A token count with an optional binary suffix: 64K = 65536, 1M = 1048576."""
    s = str(text).strip().lower()
    mult = _SUFFIX.get(s[-1:], 1)
    num = s[:-1] if s[-1:] in _SUFFIX else s
    try:
        v = float(num) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a token count (e.g. 4096, 64K, 1M)") from None
    if v < 0 or v != int(v):
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole, non-negative token count")
    return int(v)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "plan", help="plan one global batch and print per-rank predictions",
        description="Plan one global batch with Zeppelin (or a baseline) and print documents per class, "
                    "thresholds, per-rank predicted times, imbalance and the lower bound.")
    g = p.add_argument_group("workload")
    g.add_argument("--dataset", default="arxiv", help=f"preset ({', '.join(PRESETS)}), a distribution YAML, "
                   "or lengths in a .npy / .jsonl[:FIELD] / text file / Megatron .idx prefix")
    g.add_argument("--global-batch-tokens", type=parse_tokens, default=parse_tokens("1M"),
                   help="tokens in the global batch (1M, 512K, ...); 0 = a whole length file as is")
    g.add_argument("--context-length", "--max-len", type=parse_tokens, default=parse_tokens("64K"),
                   help="documents longer than this are cut into pieces of this length, as Megatron's "
                        "GPTDataset does (0 = no cut; default 64K)")
    g.add_argument("--seed", type=int, default=0, help="seed of the batch sampler")
    g = p.add_argument_group("machine and model")
    g.add_argument("--cluster", "--zeppelin-cluster", default="a800",
                   help="profile preset (a800, h800, h200; a/b/c) or a profile YAML")
    g.add_argument("--model", default="llama-7b", help="model preset (llama-3b/7b/13b/30b, tiny) or YAML")
    g.add_argument("--nodes", type=int, default=None, help="nodes in the domain (default 1)")
    g.add_argument("--world-size", type=int, default=None, help="ranks in the domain (instead of --nodes)")
    g.add_argument("--gpus-per-node", "--zeppelin-gpus-per-node", type=int, default=0,
                   help="GPUs per node (default: the profile's)")
    g.add_argument("--nics-per-node", "--zeppelin-nics-per-node", type=int, default=0,
                   help="NICs per node (default: the profile's)")
    g.add_argument("--tp", "--tensor-model-parallel-size", type=int, default=1, help="tensor-parallel size")
    g = p.add_argument_group("planner")
    g.add_argument("--strategy", "--zeppelin-strategy", default="zeppelin", choices=STRATEGIES,
                   help="strategy to show in detail (default zeppelin)")
    g.add_argument("--compare", action="store_true", help="plan every strategy on the same batch")
    g.add_argument("--cp-size", "--zeppelin-cp-size", type=int, default=0,
                   help="CP group size for static_cp / allgather_cp (0 = best for the batch)")
    g.add_argument("--routing", "--zeppelin-routing", default="auto", choices=ROUTING,
                   help="route inter-node ring messages over all NICs (auto: when the domain spans nodes)")
    g.add_argument("--no-remap", "--no-zeppelin-remap", dest="remap", action="store_false",
                   help="keep the attention layout for the linear modules (no remapping layer)")
    g.add_argument("--capacity-tokens", "--zeppelin-capacity-tokens", type=parse_tokens, default=0,
                   help="per-rank attention-token capacity (0 = 2x the mean tokens per rank)")
    g = p.add_argument_group("output")
    g.add_argument("--json", metavar="FILE", help="write the results as JSON")
    g.add_argument("--plot", metavar="FILE", help="write a PNG: length histogram and per-rank bars")
    g.add_argument("--explain", action="store_true", help="print why the thresholds are what they are")
    g.add_argument("--ranks", type=int, default=16, help="print every rank up to this many, else a summary")
    g.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    p.set_defaults(func=run)
    return p


def build_topology(args, profile) -> Topology:
    gpus = args.gpus_per_node or profile.gpus_per_node
    nics = args.nics_per_node or profile.nics_per_node
    if nics > gpus:
        nics = gpus  # a profile with more NICs than the GPUs asked for: one NIC per GPU
    wiring = profile.gpu_to_nic if (len(profile.gpu_to_nic) == gpus and nics == profile.nics_per_node) else ()
    if args.world_size is not None:
        if args.nodes is not None and args.nodes * gpus != args.world_size:
            raise ZeppelinError(f"--world-size {args.world_size} != --nodes {args.nodes} x --gpus-per-node "
                                f"{gpus}: give one of --nodes / --world-size")
        if args.world_size < 1:
            raise ZeppelinError(f"--world-size must be >= 1, got {args.world_size}")
        return Topology.from_world(args.world_size, gpus, nics, wiring)
    return Topology(args.nodes or 1, gpus, nics, wiring)


def make_plans(lengths, topo, profile, model, config, names) -> Dict[str, object]:
    """{strategy: Plan, or a string saying why there is none}. The batch is checked once first, so a
    bad batch is one clear error rather than one per strategy."""
    from ..planner import check_lengths, make_context, plan_batch
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


def run(args) -> int:
    profile = load_profile(args.cluster)
    model = load_model(args.model)
    topo = build_topology(args, profile)
    config = ZeppelinConfig(strategy=args.strategy, gpus_per_node=topo.gpus_per_node,
                            nics_per_node=topo.nics_per_node, gpu_nic_map=topo.gpu_to_nic,
                            cluster=args.cluster, routing=args.routing, remap=args.remap,
                            capacity_tokens=args.capacity_tokens, cp_size=args.cp_size, tp=args.tp)
    lengths = sample_batch(args.dataset, args.global_batch_tokens, args.seed, max_len=args.context_length or None)
    names = STRATEGIES if args.compare else (args.strategy,)
    plans = make_plans(lengths.tolist(), topo, profile, model, config, names)
    main = plans[args.strategy]
    if isinstance(main, str):
        raise ZeppelinError(f"strategy {args.strategy} {main}; choose another --strategy")
    batch = {"dataset": args.dataset, "seed": args.seed, "context_length": args.context_length,
             **describe_batch(lengths)}
    out = sys.stdout
    report.print_header(out, batch, topo, profile, model, args)
    report.print_plan(out, main, args.ranks)
    if args.compare:
        report.print_compare(out, plans)
    if args.explain:
        report.print_explain(out, main, lengths, topo, profile, model, config)
    if args.json:
        doc = report.json_document(plans, main, batch, topo, profile, model, args)
        try:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
        except OSError as e:
            raise ZeppelinError(f"cannot write --json {args.json}: {e.strerror}") from None
        print(f"wrote {args.json}", file=out)
    if args.plot:
        from ..plots.plan import plot_plan  # lazy: matplotlib is slow to import
        try:
            plot_plan(args.plot, lengths, main, plans if args.compare else None, title=_title(batch, topo, args))
        except OSError as e:
            raise ZeppelinError(f"cannot write --plot {args.plot}: {e.strerror}") from None
        print(f"wrote {args.plot}", file=out)
    return 0


def _title(batch: dict, topo: Topology, args) -> Optional[str]:
    return (f"{batch['dataset']}: {batch['documents']} documents, {batch['tokens']} tokens; "
            f"{args.model} on {args.cluster}, {topo.nodes}x{topo.gpus_per_node} GPUs")
