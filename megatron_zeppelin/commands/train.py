"""``zeppelin train``: train a GPT on megatron-core with a Zeppelin-planned (or baseline) batch.

Under torchrun (RANK/WORLD_SIZE set) every process trains its rank; otherwise ``--nproc N`` spawns N
local ranks (gloo on CPU, NCCL with CUDA). Flags follow Megatron-LM's names; the ``--zeppelin-*``
flags are integration/args.py's (the same ones ``scripts/pretrain_gpt_zeppelin.py`` adds).
"""

from __future__ import annotations

import argparse
import datetime
import os
from dataclasses import asdict

from ..errors import ZeppelinError


def add_parser(subparsers) -> argparse.ArgumentParser:
    from ..integration.args import add_zeppelin_args
    from ..token_counts import token_count

    p = subparsers.add_parser("train", help="train a GPT with megatron-core and Zeppelin (or a baseline)",
                              description=__doc__)
    g = p.add_argument_group("training")
    g.add_argument("--model", default="tiny", help="model preset (configs/models) or YAML path")
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
    g.add_argument("--context-parallel-size", type=int, default=1, help="must be 1 with --zeppelin-balance")
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1, help="must be 1 with --zeppelin-balance")
    g.add_argument("--save", default="")
    g.add_argument("--save-interval", type=int, default=0)
    g.add_argument("--load", default="")
    g.add_argument("--log-jsonl", default="", help="per-iteration metrics as JSON lines")
    g.add_argument("--tensorboard-dir", default="")
    g.add_argument("--nproc", type=int, default=0, help="spawn this many local ranks (0 = torchrun env, else 1)")
    g.add_argument("--timeout", type=float, default=3600.0)
    g.add_argument("--debug", action="store_true")
    add_zeppelin_args(p)
    p.set_defaults(func=run)
    return p


def options_from_args(args):
    from ..integration.args import config_from_args
    from ..integration.trainer import TrainOptions

    cfg = config_from_args(args)
    if not cfg.balance and args.zeppelin_strategy == "zeppelin":
        # Without --zeppelin-balance stock packed data parallelism runs through the same path.
        cfg = cfg.with_(strategy="packed_dp")
    z = {k: v for k, v in asdict(cfg).items() if k not in ("tp",)}
    return TrainOptions(model=args.model, steps=args.train_iters, tokens_per_batch=args.global_batch_tokens,
                        max_doc_tokens=args.max_doc_tokens, lr=args.lr, min_lr_ratio=args.min_lr_ratio,
                        warmup=args.lr_warmup_iters, clip_grad=args.clip_grad, weight_decay=args.weight_decay,
                        seed=args.seed, data_path=args.data_path, tp=args.tensor_model_parallel_size,
                        save=args.save, save_interval=args.save_interval, load=args.load,
                        log_path=args.log_jsonl, tensorboard_dir=args.tensorboard_dir, zeppelin=z)


def run(args) -> int:
    import torch
    import torch.distributed as dist

    from ..integration.trainer import run_local, train_worker

    if args.context_parallel_size != 1 or args.pipeline_model_parallel_size != 1:
        if not args.zeppelin_balance:  # with it, config_from_args names the flag
            raise ZeppelinError("zeppelin train runs TP x DP only: set --context-parallel-size 1 and "
                                "--pipeline-model-parallel-size 1 (use --zeppelin-strategy static_cp for CP)")
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ and not args.nproc
    if not torchrun and args.zeppelin_gpus_per_node is None:
        # local spawn: one simulated node holding the whole domain unless told otherwise
        args.zeppelin_gpus_per_node = max(1, max(1, args.nproc) // args.tensor_model_parallel_size)
    opts = options_from_args(args)
    if args.data_path:
        from ..integration.data import DocumentDataset
        from ..model_spec import load_model
        m = load_model(args.model)
        # a clear error here rather than a traceback from every rank (a bad file, token ids past the vocab)
        DocumentDataset(args.data_path).check_vocab(m.vocab, m.name)
    if torchrun:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
        try:
            train_worker(dist.get_rank(), dist.get_world_size(), asdict(opts))
        finally:
            dist.destroy_process_group()
        return 0
    run_local(opts, max(1, args.nproc), timeout=args.timeout)
    return 0
