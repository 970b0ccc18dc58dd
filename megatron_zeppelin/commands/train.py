"""``zeppelin train``: train a GPT on megatron-core with a Zeppelin-planned (or baseline) batch.

Under torchrun (RANK/WORLD_SIZE set) every process trains its rank; otherwise ``--nproc N`` spawns N
local ranks (gloo on CPU, NCCL with CUDA). Flags follow Megatron-LM's names; the ``--zeppelin-*``
flags are integration/args.py's (the same ones ``scripts/pretrain_gpt_zeppelin.py`` adds).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from dataclasses import asdict

from megatron_zeppelin.errors import ZeppelinError


def add_parser(subparsers) -> argparse.ArgumentParser:
    from megatron_zeppelin.integration.args import add_zeppelin_args
    from megatron_zeppelin.spec.token_counts import token_count

    p = subparsers.add_parser("train", help="train a GPT with megatron-core and Zeppelin (or a baseline)",
                              description=__doc__)
    g = p.add_argument_group("training")
    g.add_argument("--model", default="tiny", help="model preset (megatron_zeppelin/presets/models) or YAML path")
    g.add_argument("--train-iters", type=int, default=100)
    g.add_argument("--global-batch-tokens", type=token_count, default=8192, help="trained tokens per global micro-batch")
    g.add_argument("--max-doc-tokens", type=token_count, default=2048, help="documents longer than this are cut")
    g.add_argument("--lr", type=float, default=2e-3)
    g.add_argument("--min-lr-ratio", type=float, default=0.1, help="cosine decays to lr x this")
    g.add_argument("--lr-warmup-iters", type=int, default=5)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--data-path", default="", help="Megatron indexed dataset prefix (default: embedded corpus)")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron's sequence parallelism: the TP group splits each rank's layouts along tokens")
    g.add_argument("--expert-model-parallel-size", type=int, default=0,
                   help="MoE models: experts spread over this many DP ranks (0 = the largest size dividing both "
                        "the DP size and the expert count)")
    g.add_argument("--context-parallel-size", type=int, default=1, help="must be 1 with --zeppelin-balance")
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1,
                   help="must be 1: this trainer runs one micro-batch per step, not Megatron's pipeline "
                        "schedules; pipeline parallelism runs through the Megatron-LM entry "
                        "(python -m megatron_zeppelin.integration.pretrain_gpt, docs/megatron.md)")
    g.add_argument("--recompute-granularity", choices=("selective", "full"), default=None,
                   help="Megatron's activation recompute (full: every layer, --recompute-method uniform, 1 layer)")
    g.add_argument("--recompute-method", choices=("uniform", "block"), default=None,
                   help="with full: uniform recomputes every layer; block only the first --recompute-num-layers")
    g.add_argument("--recompute-num-layers", type=int, default=None,
                   help="with --recompute-method block: how many layers (the first ones) recompute")
    g.add_argument("--recompute-modules", nargs="*", default=None,
                   help="with selective: core_attn (default), mlp, layernorm (layernorm needs Transformer Engine)")
    g.add_argument("--save", default="")
    g.add_argument("--save-interval", type=int, default=0)
    g.add_argument("--load", default="")
    g.add_argument("--log-jsonl", default="", help="per-iteration metrics as JSON lines; an existing file is "
                   "refused unless --load resumes the run, which appends to it")
    g.add_argument("--tensorboard-dir", default="")
    g.add_argument("--nproc", type=int, default=0, help="spawn this many local ranks (0 = torchrun env, else 1)")
    g.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds any collective may wait for a peer before the run fails (default 3600)")
    g.add_argument("--debug", action="store_true")
    add_zeppelin_args(p)
    p.set_defaults(func=run)
    return p


def options_from_args(args):
    from megatron_zeppelin.integration.args import config_from_args
    from megatron_zeppelin.integration.trainer import TrainOptions

    cfg = config_from_args(args)
    if not cfg.balance and args.zeppelin_strategy == "zeppelin":
        # Without --zeppelin-balance stock packed data parallelism runs through the same path.
        cfg = cfg.with_(strategy="packed_dp")
    z = {k: v for k, v in asdict(cfg).items() if k not in ("tp",)}
    z["recompute"] = cfg.recompute.describe()  # its text form: the options travel as JSON
    return TrainOptions(model=args.model, steps=args.train_iters, tokens_per_batch=args.global_batch_tokens,
                        max_doc_tokens=args.max_doc_tokens, lr=args.lr, min_lr_ratio=args.min_lr_ratio,
                        warmup=args.lr_warmup_iters, clip_grad=args.clip_grad, weight_decay=args.weight_decay,
                        seed=args.seed, data_path=args.data_path, tp=args.tensor_model_parallel_size,
                        ep=args.expert_model_parallel_size,
                        save=args.save, save_interval=args.save_interval, load=args.load,
                        log_path=args.log_jsonl, tensorboard_dir=args.tensorboard_dir, zeppelin=z)


def _writable_dir(flag: str, path: str) -> None:
    """``path`` is, or can be created as, a directory this user may write: checked without writing."""
    p = os.path.abspath(path)
    if os.path.exists(p) and not os.path.isdir(p):
        raise ZeppelinError(f"{flag} {path}: exists and is not a directory")
    while not os.path.exists(p):
        p = os.path.dirname(p)
    if not os.path.isdir(p) or not os.access(p, os.W_OK | os.X_OK):
        raise ZeppelinError(f"{flag} {path}: {p} is not writable; pick another path")


def check_args(args) -> None:
    """Every flag is checked before any rank starts or anything is written: one line naming the flag."""
    positive = {"--train-iters": args.train_iters, "--global-batch-tokens": args.global_batch_tokens,
                "--max-doc-tokens": args.max_doc_tokens, "--lr": args.lr, "--timeout": args.timeout,
                "--tensor-model-parallel-size": args.tensor_model_parallel_size}
    for flag, v in positive.items():
        if not v > 0:
            raise ZeppelinError(f"{flag} {v}: must be > 0")
    non_negative = {"--nproc": args.nproc, "--expert-model-parallel-size": args.expert_model_parallel_size, "--lr-warmup-iters": args.lr_warmup_iters, "--clip-grad": args.clip_grad,
                    "--weight-decay": args.weight_decay, "--save-interval": args.save_interval}
    for flag, v in non_negative.items():
        if not v >= 0:
            raise ZeppelinError(f"{flag} {v}: must be >= 0" + (" (0 = the torchrun environment, else 1 rank)"
                                                               if flag == "--nproc" else ""))
    if not 0 <= args.min_lr_ratio <= 1:
        raise ZeppelinError(f"--min-lr-ratio {args.min_lr_ratio}: must be between 0 and 1")
    if args.save_interval and not args.save:
        raise ZeppelinError("--save-interval needs --save DIR")
    if args.save:
        _writable_dir("--save", args.save)
    if args.tensorboard_dir:
        _writable_dir("--tensorboard-dir", args.tensorboard_dir)
    if args.load:
        from megatron_zeppelin.integration.checkpoint import latest_step
        latest_step(args.load)  # a missing checkpoint is named before any rank starts
    if args.log_jsonl:
        if os.path.isdir(args.log_jsonl):
            raise ZeppelinError(f"--log-jsonl {args.log_jsonl}: is a directory; give a file path")
        _writable_dir("--log-jsonl", os.path.dirname(args.log_jsonl) or ".")
        if os.path.exists(args.log_jsonl) and os.path.getsize(args.log_jsonl) and not args.load:
            raise ZeppelinError(f"--log-jsonl {args.log_jsonl}: the file exists; remove it or pick another path "
                                "(only a run resumed with --load appends to it)")


def header(args, opts, world: int, backend: str) -> str:
    from megatron_zeppelin.spec.model import load_model

    m = load_model(args.model)
    z = opts.zeppelin
    tp = args.tensor_model_parallel_size
    data = args.data_path or "the embedded corpus (Python sources, byte tokens)"
    strategy = z["strategy"] + ("" if args.zeppelin_balance else " (stock Megatron packing: --zeppelin-balance plans "
                                                                 "the batch with --zeppelin-strategy)")
    sp = " + SP" if z.get("sequence_parallel") else ""
    lines = [f"zeppelin train: strategy {strategy}, {world} ranks (TP {tp}{sp} x DP {world // max(1, tp)}, {backend}, "
             f"{z.get('gpus_per_node')} GPUs per node), model {m.name} ({m.layers} layers, hidden {m.hidden}, "
             f"{m.heads} heads" + (f", {m.experts} experts, top-{m.top_k}" if m.is_moe else "") + ")",
             f"  data: {data}; {args.train_iters} iterations x {args.global_batch_tokens} tokens, documents cut at "
             f"{args.max_doc_tokens}; lr {args.lr:g} (warmup {args.lr_warmup_iters}, cosine to x{args.min_lr_ratio:g}), "
             f"seed {args.seed}"]
    if args.load:
        from megatron_zeppelin.integration.checkpoint import latest_step
        lines.append(f"  resuming from {args.load} (step {latest_step(args.load)})")
    if args.save:
        every = f"every {args.save_interval} iterations and " if args.save_interval else ""
        lines.append(f"  checkpoints: {args.save} ({every}at the end; Megatron dist_checkpointing format)")
    if args.log_jsonl:
        lines.append(f"  metrics: {args.log_jsonl} ({'appending: resumed run' if args.load else 'new file'})")
    return "\n".join(lines)


def summary(history, seconds: float, save: str) -> str:
    if not history:
        return f"zeppelin train: nothing to train (already at the last iteration) in {seconds:.0f}s"
    steady = [h["tokens_per_s"] for h in history[1:]] or [history[0]["tokens_per_s"]]
    out = (f"zeppelin train: done, iterations {history[0]['step']}-{history[-1]['step']} in {seconds:.0f}s; loss "
           f"{history[0]['loss']:.4f} -> {history[-1]['loss']:.4f}; median {statistics.median(steady):.0f} tokens/s")
    if save:
        from megatron_zeppelin.integration.checkpoint import latest_step, step_dir
        out += f"; latest checkpoint {step_dir(save, latest_step(save))}"
    return out


def run(args) -> int:
    import torch
    import torch.distributed as dist

    from megatron_zeppelin.integration.trainer import run_local, train_worker

    if args.pipeline_model_parallel_size != 1:
        raise ZeppelinError("zeppelin train runs no pipeline schedule: set --pipeline-model-parallel-size 1, "
                            "or train with pipeline parallelism through the Megatron-LM entry "
                            "(python -m megatron_zeppelin.integration.pretrain_gpt)")
    if args.zeppelin_accumulation not in ("data_order", "rounds"):  # one micro-batch: both keep it as read
        raise ZeppelinError("zeppelin train runs one micro-batch per step (no gradient accumulation): set "
                            "--zeppelin-accumulation rounds (the default) or data_order, or train joint / by_length "
                            "assignment through the Megatron-LM entry (python -m megatron_zeppelin.integration.pretrain_gpt)")
    if args.context_parallel_size != 1:
        if not args.zeppelin_balance:  # with it, config_from_args names the flag
            raise ZeppelinError("zeppelin train runs TP x DP only: set --context-parallel-size 1 and "
                                "--pipeline-model-parallel-size 1 (use --zeppelin-strategy static_cp for CP)")
    check_args(args)
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ and not args.nproc
    if not torchrun and args.zeppelin_gpus_per_node is None:
        # local spawn: one simulated node holding the whole domain unless told otherwise
        args.zeppelin_gpus_per_node = max(1, max(1, args.nproc) // args.tensor_model_parallel_size)
    opts = options_from_args(args)
    if args.data_path:
        from megatron_zeppelin.integration.data import DocumentDataset
        from megatron_zeppelin.spec.model import load_model
        m = load_model(args.model)
        # a clear error here rather than a traceback from every rank (a bad file, token ids past the vocab)
        DocumentDataset(args.data_path).check_vocab(m.vocab, m.name)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    t0 = time.time()
    if torchrun:
        lead = int(os.environ["RANK"]) == 0
        if lead:
            print(header(args, opts, int(os.environ["WORLD_SIZE"]), backend), flush=True)
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
        try:
            out = train_worker(dist.get_rank(), dist.get_world_size(), asdict(opts))
        finally:
            dist.destroy_process_group()
        if lead:
            print(summary(out["history"], time.time() - t0, args.save), flush=True)
        return 0
    from megatron_zeppelin.distributed.launch import DistributedFailure, LaunchInterrupted
    world = max(1, args.nproc)
    print(header(args, opts, world, backend), flush=True)
    try:
        history = run_local(opts, world, timeout=args.timeout)
    except LaunchInterrupted as e:
        print(f"zeppelin train: {e}" + (f"; latest complete checkpoint: {_latest(args.save)}" if args.save else ""),
              file=sys.stderr, flush=True)
        return 128 + e.signum
    except DistributedFailure as e:
        print(f"zeppelin train: failed: {e}", file=sys.stderr, flush=True)
        return 1
    print(summary(history, time.time() - t0, args.save), flush=True)
    return 0


def _latest(save: str) -> str:
    from megatron_zeppelin.integration.checkpoint import CheckpointError, latest_step, step_dir
    try:
        return step_dir(save, latest_step(save))
    except CheckpointError:
        return "none"
