"""``zeppelin demo``: the first job to run. Trains a tiny GPT on the embedded corpus three times
(zeppelin, packed_dp, static_cp) on 4 local ranks laid out as 2 nodes x 2 GPUs, prints one table
and writes plots.

On a CPU machine the ranks are gloo processes (the CPU shim makes megatron-core run there); with
CUDA the same command uses NCCL and the GPU kernels. Every launch has a timeout: it never hangs.

>>> summarize([{"step": 1, "loss": 5.0, "tokens_per_s": 10.0, "cpu_s_per_rank": [1.0, 3.0],
...              "pred_imbalance": 1.5, "bytes_nvlink": 4e6, "bytes_nic": 0}])["compute_max_over_mean"]
1.5
>>> from types import SimpleNamespace as NS
>>> check_flags(NS(**{**vars(add_parser_defaults()), "ranks": 3}))
Traceback (most recent call last):
...
megatron_zeppelin.flags.domain.FlagError: --ranks 3 is not a whole number of nodes of --gpus-per-node 2 (set --ranks to a multiple of --gpus-per-node)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Dict, List

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.token_counts import token_count

STRATEGIES = ("zeppelin", "packed_dp", "static_cp")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("demo", help="train a tiny GPT with zeppelin, packed_dp and static_cp and compare",
                              description=__doc__.split("\n\n>>>")[0])
    p.add_argument("--model", default="tiny",
                   help="model preset (megatron_zeppelin/presets/models) or YAML path, e.g. tiny-moe (default tiny)")
    p.add_argument("--steps", type=int, default=20, help="training steps per strategy (default 20)")
    p.add_argument("--global-batch-tokens", type=token_count, default=8192, help="trained tokens per step (default 8192)")
    p.add_argument("--max-doc-tokens", type=token_count, default=4096, help="longest document kept whole (default 4096)")
    p.add_argument("--ranks", type=int, default=4, help="domain ranks (default 4)")
    p.add_argument("--gpus-per-node", type=int, default=2, help="ranks per simulated node (default 2)")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel size: each domain rank is a TP group of this many processes (default 1)")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron's sequence parallelism over each TP group (needs --tp > 1)")
    p.add_argument("--static-cp-size", type=int, default=0,
                   help="CP group size of the static_cp baseline (default 0: the best for each batch)")
    p.add_argument("--cluster", default="auto",
                   help="hardware profile the planner's cost model uses: a preset, a YAML, or auto (default: on "
                        "CPU, measure this machine first, about 15 s, so the plan fits the machine it runs on; "
                        "on GPU, h200)")
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated strategies to run")
    p.add_argument("--out", default="zeppelin_demo", help="directory for metrics and plots (default ./zeppelin_demo)")
    p.add_argument("--data-path", default="", help="Megatron indexed dataset prefix (default: embedded corpus)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a run is aborted")
    p.add_argument("--debug", action="store_true", help="show tracebacks for user errors")
    p.set_defaults(func=run)
    return p


def add_parser_defaults() -> argparse.Namespace:
    """The demo's flags at their defaults (what ``zeppelin demo`` with no flag runs)."""
    sub = argparse.ArgumentParser().add_subparsers()
    return add_parser(sub).parse_args([])


def check_flags(args) -> None:
    """Every flag, checked before any work (no calibration, no process started): one FlagError naming
    the flag to change."""
    from megatron_zeppelin.flags.domain import FlagError, require_at_least
    from megatron_zeppelin.spec.config import STRATEGIES as KNOWN
    require_at_least(args, (("steps", "--steps", 1), ("ranks", "--ranks", 1), ("gpus_per_node", "--gpus-per-node", 1),
                            ("tp", "--tp", 1), ("global_batch_tokens", "--global-batch-tokens", 1),
                            ("max_doc_tokens", "--max-doc-tokens", 1), ("static_cp_size", "--static-cp-size", 0)))
    if args.ranks % args.gpus_per_node:
        raise FlagError(f"--ranks {args.ranks} is not a whole number of nodes of --gpus-per-node {args.gpus_per_node} "
                        "(set --ranks to a multiple of --gpus-per-node)")
    if args.static_cp_size and args.ranks % args.static_cp_size:
        raise FlagError(f"--static-cp-size {args.static_cp_size} does not divide --ranks {args.ranks} (set it to a "
                        "divisor, or 0 for the best per batch)")
    if args.sequence_parallel and args.tp == 1:
        raise FlagError("--sequence-parallel needs --tp > 1")
    if not args.timeout > 0:
        raise FlagError(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    names = [s.strip() for s in args.strategies.split(",") if s.strip()]
    bad = [n for n in names if n not in KNOWN]
    if bad or not names:
        raise FlagError(f"--strategies: unknown strategy {', '.join(bad) or '(none given)'} (choose from "
                        f"{', '.join(KNOWN)}, comma-separated)")
    if args.global_batch_tokens < args.ranks:
        raise FlagError(f"--global-batch-tokens {args.global_batch_tokens} gives a rank no token over --ranks "
                        f"{args.ranks} (set it to at least {args.ranks})")
    from megatron_zeppelin.spec.model import load_model
    m = load_model(args.model)  # a ModelSpecError names --model
    if m.heads % args.tp or m.kv_heads % args.tp:
        raise FlagError(f"--tp {args.tp} does not divide {m.name}'s {m.heads} attention heads and {m.kv_heads} KV "
                        "heads (set --tp to a common divisor)")
    if args.cluster != "auto":
        from megatron_zeppelin.spec.hardware import load_profile
        load_profile(args.cluster)  # a ProfileError names --cluster
    if args.data_path and not os.path.isfile(args.data_path + ".idx"):
        raise FlagError(f"--data-path {args.data_path}: no {args.data_path}.idx (give a Megatron indexed dataset "
                        "prefix, or leave it out for the embedded corpus)")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise FlagError(f"--out {args.out} is a file, not a directory (set --out to a directory)")


def summarize(history: List[dict]) -> Dict[str, float]:
    per_rank = [sum(h["cpu_s_per_rank"][r] for h in history) for r in range(len(history[0]["cpu_s_per_rank"]))]
    steady = history[1:] or history  # step 1 pays one-time warm-up
    return {"final_loss": history[-1]["loss"],
            "tokens_per_s": statistics.median(h["tokens_per_s"] for h in steady),
            "compute_max_over_mean": max(per_rank) / (sum(per_rank) / len(per_rank)),
            "pred_imbalance": statistics.mean(h["pred_imbalance"] for h in history),
            "mb_inter_node": sum(h["bytes_nic"] for h in history) / 1e6,
            "mb_intra_node": sum(h["bytes_nvlink"] for h in history) / 1e6,
            "cpu_s_per_rank": per_rank}


def table(rows: Dict[str, Dict[str, float]], cpu: bool = True) -> str:
    """What the demo shows first: the measured compute balance (the busiest rank's compute over the mean,
    what sets a step's time when every rank has its own GPU) beside the planner's predicted imbalance,
    then the loss and the traffic; tokens/s last (on a CPU shared by the ranks it follows total work)."""
    speed = "CPU tokens/s" if cpu else "tokens/s"
    head = f"{'strategy':<10} {'compute max/mean':>16} {'pred imb':>8} {'final loss':>10} " \
           f"{'MB inter-node':>13} {'MB intra-node':>13} {speed:>12}"
    lines = [head, "-" * len(head)]
    for name, s in rows.items():
        lines.append(f"{name:<10} {s['compute_max_over_mean']:>16.3f} {s['pred_imbalance']:>8.3f} "
                     f"{s['final_loss']:>10.4f} {s['mb_inter_node']:>13.2f} {s['mb_intra_node']:>13.2f} "
                     f"{s['tokens_per_s']:>12.0f}")
    return "\n".join(lines)


def noisy_profile_note(warnings: List[str]) -> str:
    """What a calibration that stayed noisy means for the demo's numbers (empty when it did not).

    >>> print(noisy_profile_note(["attention L=256: forward repeats varied 4.0x"]))  # doctest: +NORMALIZE_WHITESPACE
      cost model: kept, although 1 measurement stayed noisy after measuring again (attention L=256: forward
      repeats varied 4.0x): the plans balance the costs this profile says, so 'pred imb' is the balance by
      these noisy costs; 'compute max/mean' is measured and stands on its own. For steadier plans rerun on a
      quieter machine or pass --cluster with a profile from `zeppelin calibrate`.
    """
    if not warnings:
        return ""
    n = f"{len(warnings)} measurement{'s' if len(warnings) > 1 else ''}"
    return (f"  cost model: kept, although {n} stayed noisy after measuring again "
            f"({'; '.join(warnings[:2])}{'; ...' if len(warnings) > 2 else ''}): the plans balance the costs this "
            "profile says, so 'pred imb' is the balance by these noisy costs; 'compute max/mean' is measured and "
            "stands on its own. For steadier plans rerun on a quieter machine or pass --cluster with a profile "
            "from `zeppelin calibrate`.")


def plots(histories: Dict[str, List[dict]], rows: Dict[str, Dict], out: str) -> List[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, h in histories.items():
        ax.plot([x["step"] for x in h], [x["loss"] for x in h], label=name)
    ax.set_xlabel("step"), ax.set_ylabel("loss (per-token mean)"), ax.legend(), ax.set_title("loss curves")
    paths.append(os.path.join(out, "loss_curves.png"))
    fig.tight_layout(), fig.savefig(paths[-1], dpi=110), plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    names = list(rows)
    w = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        load = rows[name]["cpu_s_per_rank"]
        ax.bar([r + i * w for r in range(len(load))], load, width=w, label=name)
    nranks = len(rows[names[0]]["cpu_s_per_rank"]) if names else 0
    ax.set_xticks([r + w * (len(names) - 1) / 2 for r in range(nranks)], [str(r) for r in range(nranks)])
    ax.set_xlabel("domain rank"), ax.set_ylabel("measured compute (CPU s, all steps)")
    ax.set_title("per-rank load"), ax.legend()
    paths.append(os.path.join(out, "per_rank_load.png"))
    fig.tight_layout(), fig.savefig(paths[-1], dpi=110), plt.close(fig)
    return paths


def run(args) -> int:
    check_flags(args)  # before torch is imported, the data built or the machine calibrated
    from megatron_zeppelin.distributed.launch import LaunchInterrupted
    try:
        return _run(args)
    except LaunchInterrupted as e:  # SIGTERM/SIGINT during calibration or training: every rank was stopped
        print(f"zeppelin demo: {e}", file=sys.stderr, flush=True)
        return 128 + e.signum


def _run(args) -> int:
    import torch

    from megatron_zeppelin.distributed.launch import DistributedFailure
    from megatron_zeppelin.integration.data import default_corpus
    from megatron_zeppelin.integration.trainer import TrainOptions, run_local

    names = [s.strip() for s in args.strategies.split(",") if s.strip()]
    procs = args.ranks * args.tp
    if torch.cuda.is_available() and torch.cuda.device_count() < procs:
        raise ZeppelinError(f"--ranks {args.ranks} x --tp {args.tp} needs {procs} GPUs, this machine has "
                            f"{torch.cuda.device_count()}: lower --ranks or --tp")
    os.makedirs(args.out, exist_ok=True)
    backend = "NCCL" if torch.cuda.is_available() else "gloo (CPU)"
    nodes = args.ranks // max(1, args.gpus_per_node)
    from megatron_zeppelin.spec.model import load_model
    m = load_model(args.model)
    kind = f"{m.name} GPT" + (f" (MoE: {m.experts} experts, top-{m.top_k}, expert parallel over the ranks)"
                              if m.is_moe else "")
    tp = f" x TP {args.tp}{' + SP' if args.sequence_parallel else ''} ({procs} processes)" if args.tp > 1 else ""
    print(f"zeppelin demo: {kind}, {args.steps} steps x {args.global_batch_tokens} tokens, {args.ranks} ranks "
          f"as {nodes} nodes x {args.gpus_per_node} GPUs{tp}, {backend}", flush=True)
    if not args.data_path:
        t = time.time()
        print("  data: embedded corpus (Python standard library sources, byte tokens) ...", end=" ", flush=True)
        prefix = default_corpus()
        print(f"{prefix} ({time.time() - t:.1f}s)", flush=True)
    cluster = args.cluster
    if cluster == "auto" and torch.cuda.is_available():
        cluster = "h200"
    elif cluster == "auto":
        from megatron_zeppelin.calibrate.measure import measure_profile
        print("  cost model: measuring this machine (attention by length, GEMM, gloo) ...", flush=True)
        prof, measured = measure_profile(m, "cpu", tp=args.tp, repeats=3, gpus_per_node=args.gpus_per_node,
                                         name="demo-cpu", log=lambda m: print("    " + m, flush=True))
        cluster = os.path.join(args.out, "cpu_profile.yaml")
        prof.save(cluster)
        print(f"  cost model: {cluster}", flush=True)
        note = noisy_profile_note(measured.get("warnings", []))
        if note:
            print(note, flush=True)
    histories, rows = {}, {}
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] training with {name} (starting {procs} processes) ...", flush=True)
        t = time.time()
        z = {"strategy": name, "gpus_per_node": args.gpus_per_node, "cluster": cluster, "cp_size": args.static_cp_size
             if name in ("static_cp", "allgather_cp") else 0, "sequence_parallel": args.sequence_parallel}
        opts = TrainOptions(model=args.model, steps=args.steps, tokens_per_batch=args.global_batch_tokens, tp=args.tp,
                            max_doc_tokens=args.max_doc_tokens, data_path=args.data_path, label=name,
                            log_path=os.path.join(args.out, f"{name}.jsonl"), zeppelin=z)
        if os.path.exists(opts.log_path):
            os.remove(opts.log_path)
        try:
            histories[name] = run_local(opts, procs, timeout=args.timeout)
        except DistributedFailure as e:  # the first line names the rank that caused it
            print(f"zeppelin demo: {name} failed: {e}", file=sys.stderr, flush=True)
            return 1
        rows[name] = summarize(histories[name])
        print(f"    done in {time.time() - t:.0f}s", flush=True)
    print()
    print(table(rows, cpu=not torch.cuda.is_available()))
    print("\n'compute max/mean': the busiest rank's measured compute over the mean rank's, all steps (1.000 = "
          "even): the balance that sets a step's time when every rank has its own GPU; 'pred imb': the planner's "
          "predicted imbalance.")
    if not torch.cuda.is_available():
        print("On a CPU with fewer cores than ranks, CPU tokens/s follows the total work of all ranks, not the "
              "slowest one, so it says little about the strategies.")
    paths = plots(histories, rows, args.out)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print()
    print(f"metrics: {os.path.join(args.out, 'summary.json')} and {args.out}/<strategy>.jsonl")
    for p in paths:
        print(f"plot: {p}")
    return 0
