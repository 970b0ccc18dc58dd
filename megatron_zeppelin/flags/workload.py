"""The workload flags ``plan``, ``simulate`` and ``advise`` share: the dataset (and the tokenizer that counts a text
dataset's tokens), the global batch, the context length, seeds; Megatron-LM's names are accepted where
they mean the same (``--data-path``, ``--seq-length``, ``--global-batch-size``, ``--micro-batch-size``,
``--tokenizer-type`` / ``--tokenizer-model`` / ``--vocab-file`` / ``--merge-file``).

Megatron's batch sizes count sequences of ``--seq-length`` tokens (see ``resolve_batch``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, Optional

from megatron_zeppelin.spec.token_counts import parse_tokens, token_count
from megatron_zeppelin.data.workloads import PRESETS
from megatron_zeppelin.flags.domain import FlagError, require_at_least

DEFAULT_BATCH = parse_tokens("1M")


def add_workload_flags(g, batch_type: Callable = token_count, spread: bool = True) -> None:
    """The workload group; ``spread``: with ``--seeds`` (a command reporting over several batches)."""
    g.add_argument("--dataset", "--data-path", "--train-data-path", dest="dataset", default="arxiv", nargs="+",
                   action=BlendAction, metavar="DATASET",
                   help=f"preset ({', '.join(PRESETS)}), a distribution YAML, or lengths in a .npy / .jsonl[:FIELD] / "
                        "text file / Megatron .idx prefix (--data-path: Megatron's name); or a blend as Megatron "
                        "writes one: 0.3 A 0.7 B (weights are token shares) or A B (each dataset's share its size)")
    g.add_argument("--data-args-path", dest="dataset", action=BlendFileAction, metavar="FILE",
                   help="Megatron's: a file holding the --data-path list (a blend)")
    g.add_argument("--tokenizer", "--tokenizer-type", dest="tokenizer", default=None,
                   help="what counts the tokens of a .jsonl text field: bytes/4 (default, an estimate), byte, "
                        "NullTokenizer, HuggingFaceTokenizer (with --tokenizer-model), GPT2BPETokenizer (with "
                        "--vocab-file/--merge-file), SentencePieceTokenizer (with --tokenizer-model), or a "
                        "tokenizer.json / local HuggingFace name or directory")
    g.add_argument("--tokenizer-model", default="", help="HuggingFace name/path or SentencePiece model file")
    g.add_argument("--vocab-file", default="", help="GPT2BPETokenizer vocabulary (vocab.json)")
    g.add_argument("--merge-file", default="", help="GPT2BPETokenizer merges (merges.txt)")
    g.add_argument("--global-batch-tokens", type=batch_type, default=None,
                   help="tokens in the global batch (1M, 512K, ...; default 1M); 0 = a whole length file as is")
    g.add_argument("--global-batch-size", type=int, default=None,
                   help="Megatron's: sequences of --seq-length in the global batch (instead of --global-batch-tokens)")
    g.add_argument("--micro-batch-size", type=int, default=None,
                   help="Megatron's: sequences per rank in one step; the batch planned is then one step, "
                        "this x --seq-length x data-parallel ranks tokens")
    g.add_argument("--context-length", "--seq-length", "--max-len", dest="context_length", type=token_count,
                   default=parse_tokens("64K"),
                   help="documents longer than this are cut into pieces of this length, as Megatron's GPTDataset "
                        "cuts samples of --seq-length (0 = no cut; default 64K)")
    g.add_argument("--seed", type=int, default=0, help="seed of the batch sampler")
    if spread:
        g.add_argument("--seeds", type=int, default=1,
                       help="sample N batches (seeds SEED .. SEED+N-1) and report the mean and spread over them")


def add_tp_flag(g, default: Optional[int] = 1, help: str = "tensor-parallel size: each domain rank is a TP group "
                                                            "of this many GPUs") -> None:
    """Megatron's tensor-parallel size, under both names (one definition for every command)."""
    g.add_argument("--tp", "--tensor-model-parallel-size", type=int, default=default, help=help)


def whole_batch_tokens(args) -> "tuple[int, str]":
    """(tokens of the whole global batch, how they were read) from --global-batch-tokens or Megatron's
    --global-batch-size x --seq-length, for a command that splits the batch into steps itself (advise).

    >>> from types import SimpleNamespace as NS
    >>> whole_batch_tokens(NS(global_batch_tokens=None, global_batch_size=64, context_length=8192))
    (524288, '--global-batch-size 64 x --seq-length 8192 = 524288 tokens')
    """
    gbs, tokens, seq = args.global_batch_size, args.global_batch_tokens, args.context_length
    require_at_least(args, (("global_batch_size", "--global-batch-size", 1),))
    if gbs is not None and tokens is not None:
        raise FlagError("give --global-batch-size (sequences) or --global-batch-tokens, not both")
    if gbs is None:
        tokens = DEFAULT_BATCH if tokens is None else tokens
        return tokens, f"--global-batch-tokens {tokens}"
    if not seq:
        raise FlagError("--global-batch-size counts sequences of --seq-length: set --seq-length > 0")
    return gbs * seq, f"--global-batch-size {gbs} x --seq-length {seq} = {gbs * seq} tokens"


class BlendAction(argparse.Action):
    """One ``--data-path`` value is stored as is; several (a Megatron blend, ``0.3 A 0.7 B``) are joined
    by spaces into one ``--dataset`` string that workloads.load_source reads as a blend. (A plan
    samples training batches: ``--train-data-path`` is read the same way.)"""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values[0] if len(values) == 1 else " ".join(values))


class BlendFileAction(argparse.Action):
    """``--data-args-path FILE``: the blend list read from FILE (whitespace-separated, as Megatron reads it)."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            with open(values) as f:
                items = f.read().split()
        except OSError as e:
            parser.error(f"{option_string} {values}: {e.strerror} (give a file holding the --data-path list)")
        if not items:
            parser.error(f"{option_string} {values}: the file names no dataset")
        setattr(namespace, self.dest, " ".join(items))


@dataclass(frozen=True)
class Batch:
    tokens: object  # int, or "memory" (simulate)
    capacity: object  # int (0 = the planner's default), or "memory"
    note: str = ""  # how Megatron's batch sizes were read, to print
    steps: int = 1  # gradient-accumulation steps of one iteration: Megatron's G / (M x data-parallel ranks)


def resolve_batch(args, ranks: int) -> Batch:
    """The batch one plan balances, from Megatron's or Zeppelin's flags, checked. Zeppelin balances the
    documents of one step over the data-parallel ranks: with ``--micro-batch-size M`` that step holds M
    sequences per rank (M x seq-length x ranks tokens), and ``--global-batch-size G`` is then G / (M x
    ranks) such steps; without M the whole global batch is one step."""
    require_at_least(args, (("global_batch_size", "--global-batch-size", 1), ("micro_batch_size", "--micro-batch-size", 1),
                            ("seeds", "--seeds", 1), ("seed", "--seed", 0)))
    seq = args.context_length
    gbs, mbs = args.global_batch_size, args.micro_batch_size
    tokens, note, steps = args.global_batch_tokens, "", 1
    if (gbs or mbs) and not seq:
        raise FlagError("--global-batch-size / --micro-batch-size count sequences of --seq-length: set "
                        "--seq-length > 0")
    if (gbs or mbs) and tokens is not None:
        raise FlagError("give --global-batch-size / --micro-batch-size (sequences) or --global-batch-tokens, not both")
    if mbs is not None:
        tokens = mbs * seq * ranks
        note = (f"one micro-batch step: --micro-batch-size {mbs} x --seq-length {seq} x {ranks} data-parallel "
                f"ranks = {tokens} tokens")
        if gbs is not None:
            if gbs % (mbs * ranks):
                raise FlagError(f"--global-batch-size {gbs} is not a multiple of --micro-batch-size {mbs} x {ranks} "
                                "data-parallel ranks (as Megatron requires)")
            note += f"; --global-batch-size {gbs} is {gbs // (mbs * ranks)} such step(s) per iteration"
            steps = gbs // (mbs * ranks)
    elif gbs is not None:
        tokens = gbs * seq
        note = f"--global-batch-size {gbs} x --seq-length {seq} = {tokens} tokens, balanced as one step"
    return Batch(DEFAULT_BATCH if tokens is None else tokens, getattr(args, "capacity_tokens", 0), note, steps)


def tokenizer_from(args):
    """The text tokenizer the flags name (None: the default, for a dataset without text)."""
    from megatron_zeppelin.data.tokenizers import make_tokenizer
    if args.tokenizer is None and not args.tokenizer_model:
        return None
    spec = args.tokenizer or "HuggingFaceTokenizer"
    return make_tokenizer(spec, args.tokenizer_model, args.vocab_file, args.merge_file)


def dataset_line(spec: str, stats: dict, counted_by: Optional[str]) -> str:
    """One line on the whole dataset: what the batches are sampled from."""
    if stats["kind"] == "blend":
        parts = "; ".join(f"{d['path']} (token share {d['token_share']:.3f}): {d['documents']} documents, "
                          f"{d['tokens']} tokens, length p50 {d['p50']} / max {d['max']} / mean {d['mean']:.0f}"
                          for d in stats["datasets"])
        how = "the blend's weights" if stats["weighted"] else "each dataset's tokens (no weights given)"
        return (f"dataset: blend of {len(stats['datasets'])} datasets, token shares from {how} (lengths counted "
                f"by {counted_by}): {parts}")
    if stats["kind"] == "distribution":
        return (f"dataset: {spec}: length distribution '{stats['name']}' ({stats['components']} component(s), "
                f"mean {stats['mean']:.0f} tokens per document); batches are drawn from it")
    return (f"dataset: {spec}: {stats['documents']} documents, {stats['tokens']} tokens (counted by {counted_by}); "
            f"length min {stats['min']} / p50 {stats['p50']} / p90 {stats['p90']} / p99 {stats['p99']} / "
            f"max {stats['max']} / mean {stats['mean']:.0f}")


def counted_by(spec: str, tokenizer) -> str:
    """What the lengths of ``spec`` are: the file's own token counts, or the tokenizer's count of its text
    (a .jsonl whose first record's field is a string)."""
    import json
    import os
    from megatron_zeppelin.data.blend import is_blend, parse_blend
    if is_blend(spec):
        return "; ".join(dict.fromkeys(counted_by(p, tokenizer) for p in parse_blend(spec.split()).paths))
    path, field = spec, None
    if not os.path.isfile(spec) and ":" in spec:
        path, field = spec.rsplit(":", 1)
    if path.endswith(".jsonl") and os.path.isfile(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    rec = json.loads(line)
                    key = field or ("length" if "length" in rec else "text")
                    if isinstance(rec.get(key), str):
                        from megatron_zeppelin.data.tokenizers import make_tokenizer
                        return f"--tokenizer {(tokenizer or make_tokenizer()).name} on field '{key}'"
                    break
    return "the file's own lengths"
