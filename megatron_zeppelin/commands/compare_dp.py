"""``zeppelin compare-dp``: train the same GPT on the same data with each data-parallel variant
(a plain single process, naive, bucketed, torch DDP, megatron-core DDP, ZeRO-1/2/3) on 1, 2, 4 CPU
gloo ranks, with Zeppelin balancing off and on, for one or more model sizes; print the table,
write JSON and plots."""

from __future__ import annotations

import argparse
import sys
import time

from megatron_zeppelin.dp_study.base import VARIANTS
from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.token_counts import token_count


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "compare-dp", aliases=["compare_dp"], help="compare data-parallel variants on CPU gloo ranks",
        description="Train the same tiny GPT (megatron-core, Zeppelin batch path) on the same documents "
                    "with each DP variant; report epoch time, scaling efficiency, throughput, peak "
                    "memory per rank (measured and predicted) and loss curves.")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4], help="world sizes to run (default 1 2 4)")
    p.add_argument("--steps", type=int, default=6, help="global batches per run = one epoch (default 6)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), metavar="VARIANT",
                   help=f"some of {' '.join(VARIANTS)} (default all)")
    bal = p.add_mutually_exclusive_group()
    bal.add_argument("--zeppelin-balance", dest="balance", action="store_const", const="on",
                     help="only with Zeppelin balancing (default: both off and on)")
    bal.add_argument("--no-zeppelin-balance", dest="balance", action="store_const", const="off",
                     help="only packed DP batches")
    p.add_argument("--model", nargs="+", default=["tiny"], metavar="MODEL",
                   help="model preset(s) or YAML: tiny (activations dominate), dp-20m (model states dominate)")
    p.add_argument("--epoch", action="store_true", help="train one pass over the corpus (--steps ignored)")
    p.add_argument("--corpus-files", type=int, default=0,
                   help="use the first N standard-library files as the corpus (0 = all; an epoch of all is long)")
    p.add_argument("--global-batch-tokens", type=token_count, default=8192, help="trained tokens per global batch")
    p.add_argument("--max-doc-tokens", type=token_count, default=1024, help="documents are cut to this length")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip the tracked memory step")
    p.add_argument("--timeout", type=float, default=900, help="seconds per world size before giving up")
    p.add_argument("--out", default="results/compare_dp", help="output directory (JSON, PNG)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from megatron_zeppelin.distributed.launch import run_distributed
    from megatron_zeppelin.reports import dp_study as report
    from megatron_zeppelin.dp_study.runner import RunSpec, worker
    from megatron_zeppelin.integration.data import build_corpus, cache_dir, default_corpus
    from megatron_zeppelin.spec.model import load_model

    if any(w < 1 for w in args.ranks):
        raise ZeppelinError(f"--ranks must be >= 1, got {args.ranks}")
    if args.corpus_files < 0:
        raise ZeppelinError(f"--corpus-files must be >= 0, got {args.corpus_files}")
    for m in args.model:
        load_model(m)  # an unknown model fails here, naming --model
    balance = {"on": (True,), "off": (False,), None: (False, True)}[args.balance]
    specs = [RunSpec(variants=tuple(args.variants), steps=args.steps, balance=balance, model=m,
                     tokens_per_batch=args.global_batch_tokens, max_doc_tokens=args.max_doc_tokens,
                     measure_memory=args.memory, epoch=args.epoch).check() for m in args.model]
    # built once here, before the ranks read it
    if args.corpus_files:
        import os
        prefix = os.path.join(cache_dir(), f"stdlib_blocks_v1_first{args.corpus_files}")
        corpus = prefix if os.path.exists(prefix + ".idx") else build_corpus(prefix, args.corpus_files)
    else:
        corpus = default_corpus()
    records, t0 = [], time.perf_counter()
    for spec in specs:
        for w in sorted(set(args.ranks)):
            print(f"compare-dp: {spec.model}, {w} rank(s), {len(spec.variants)} variant(s) x {len(balance)} "
                  "balance mode(s)...", file=sys.stderr, flush=True)
            for rank_records in run_distributed(worker, w, spec, corpus, timeout=args.timeout):
                records.extend(rank_records)
    rows = report.summarize(records)
    print(report.format_table(rows))
    gap = report.max_loss_gap(rows)
    print(f"largest loss difference between any two runs, any step: {gap:.2e} (same math: float32 "
          f"reduction-order noise only)")
    meta = {"spec": specs[0].__dict__ | {"variants": list(spec.variants), "balance": list(balance),
                                         "model": list(args.model), "corpus": corpus},
            "ranks": sorted(set(args.ranks)), "wall_s": time.perf_counter() - t0, "max_loss_gap": gap,
            "memory": "peak live tensor bytes per rank by torch MemTracker over one extra step"}
    paths = report.write_outputs(rows, records, args.out, meta)
    print("wrote " + ", ".join(paths.values()))
    return 0
