"""``zeppelin demo``: the first job to run. Trains a tiny GPT on the embedded corpus three times
(zeppelin, packed_dp, static_cp) on 4 local ranks laid out as 2 nodes x 2 GPUs, prints one table
and writes plots.

On a CPU machine the ranks are gloo processes (the CPU shim makes megatron-core run there); with
CUDA the same command uses NCCL and the GPU kernels. Every launch has a timeout: it never hangs.

>>> summarize([{"step": 1, "loss": 5.0, "tokens_per_s": 10.0, "cpu_s_per_rank": [1.0, 3.0],
...              "pred_imbalance": 1.5, "bytes_nvlink": 4e6, "bytes_nic": 0}])["compute_max_over_mean"]
1.5
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


def table(rows: Dict[str, Dict[str, float]]) -> str:
    head = f"{'strategy':<10} {'final loss':>10} {'tokens/s':>9} {'compute max/mean':>16} {'pred imb':>8} " \
           f"{'MB inter-node':>13} {'MB intra-node':>13}"
    lines = [head, "-" * len(head)]
    for name, s in rows.items():
        lines.append(f"{name:<10} {s['final_loss']:>10.4f} {s['tokens_per_s']:>9.0f} {s['compute_max_over_mean']:>16.3f} "
                     f"{s['pred_imbalance']:>8.3f} {s['mb_inter_node']:>13.2f} {s['mb_intra_node']:>13.2f}")
    return "\n".join(lines)


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
    if args.tp < 1:
        raise ZeppelinError(f"--tp {args.tp}: must be >= 1")
    if args.sequence_parallel and args.tp == 1:
        raise ZeppelinError("--sequence-parallel needs --tp > 1")
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
        prof, _ = measure_profile(m, "cpu", tp=args.tp, repeats=3, gpus_per_node=args.gpus_per_node,
                                  name="demo-cpu", log=lambda m: print("    " + m, flush=True))
        cluster = os.path.join(args.out, "cpu_profile.yaml")
        prof.save(cluster)
        print(f"  cost model: {cluster}", flush=True)
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
    print(table(rows))
    if not torch.cuda.is_available():
        print("\nOn a CPU with fewer cores than ranks, tokens/s follows the total work of all ranks, not the slowest "
              "one;\n'compute max/mean' (CPU seconds of the busiest rank over the mean) is the balance that "
              "sets step time on GPUs.")
    paths = plots(histories, rows, args.out)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print()
    print(f"metrics: {os.path.join(args.out, 'summary.json')} and {args.out}/<strategy>.jsonl")
    for p in paths:
        print(f"plot: {p}")
    return 0
