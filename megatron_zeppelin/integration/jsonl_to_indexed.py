"""Make a Megatron indexed dataset (``PREFIX.bin`` / ``PREFIX.idx``) from a JSONL of texts with
megatron-core's own IndexedDatasetBuilder: Megatron-LM's ``tools/preprocess_data.py`` is not in the
megatron-core wheel. One document per line (the ``--json-key`` field, default ``text``), its token
ids from ``--tokenizer`` (the tokenizers of ``zeppelin plan``, data/tokenizers.py), an optional
end-of-document id appended (``--append-eod ID``, as preprocess_data.py's ``--append-eod``). The
file is streamed, with a progress line on long work; ``--lengths FILE.npy`` also saves every
document's length, a dataset ``zeppelin plan --dataset FILE.npy`` reads at once.

    python -m megatron_zeppelin.integration.jsonl_to_indexed --input docs.jsonl \\
        --output-prefix data/docs --tokenizer tokenizer.json [--lengths data/docs_lengths.npy]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from megatron_zeppelin.errors import ZeppelinError


def convert(path: str, prefix: str, tokenizer, key: str = "text", append_eod=None, lengths_path: str = "") -> int:
    """Write ``prefix``.bin/.idx; returns the number of documents."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from megatron_zeppelin.data.jsonl_lengths import records
    from megatron_zeppelin.data.progress import Progress

    if tokenizer.encode is None:
        raise ZeppelinError(f"--tokenizer {tokenizer.name} has no token ids (an estimate): name a real tokenizer")
    top = max(tokenizer.vocab, (append_eod or 0) + 1)
    dtype = np.uint16 if 0 < top <= 65500 else np.int32  # Megatron's DType.optimal_dtype
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    tmp = f"{prefix}.tmp{os.getpid()}"
    builder = IndexedDatasetBuilder(tmp + ".bin", dtype=dtype)
    progress = Progress(f"tokenizing {path} ({tokenizer.name})", os.path.getsize(path))
    lengths = []
    for n, text, done, name in records(path, key, "--input"):
        if not isinstance(text, str):
            raise ZeppelinError(f"{path} line {n}: field '{name}' is not a text (fix --json-key)")
        ids = list(tokenizer.encode(text)) + ([append_eod] if append_eod is not None else [])
        if not ids:
            continue  # Megatron's preprocess_data.py skips empty documents too
        builder.add_document(torch.tensor(np.asarray(ids, dtype=dtype)), [len(ids)])
        lengths.append(len(ids))
        progress.update(done, len(lengths))
    if not lengths:
        raise ZeppelinError(f"{path}: no non-empty document (fix --input / --json-key)")
    builder.finalize(tmp + ".idx")
    os.replace(tmp + ".bin", prefix + ".bin")  # .bin first: whoever sees the .idx sees a whole pair
    os.replace(tmp + ".idx", prefix + ".idx")
    progress.finish(os.path.getsize(path))
    if lengths_path:
        np.save(lengths_path, np.asarray(lengths, dtype=np.int64))
    return len(lengths)


def main(argv=None) -> int:
    from megatron_zeppelin.data.tokenizers import make_tokenizer

    p = argparse.ArgumentParser(prog="python -m megatron_zeppelin.integration.jsonl_to_indexed",
                                description="JSONL texts -> a Megatron indexed dataset (PREFIX.bin/.idx)")
    p.add_argument("--input", required=True, help="JSONL file, one document per line")
    p.add_argument("--output-prefix", required=True, help="writes PREFIX.bin and PREFIX.idx")
    p.add_argument("--json-key", default="text", help="the field holding the text (default text)")
    p.add_argument("--tokenizer", "--tokenizer-type", dest="tokenizer", required=True,
                   help="byte, NullTokenizer, HuggingFaceTokenizer (with --tokenizer-model), GPT2BPETokenizer "
                        "(with --vocab-file/--merge-file), SentencePieceTokenizer, or a tokenizer.json / local name")
    p.add_argument("--tokenizer-model", default="")
    p.add_argument("--vocab-file", default="")
    p.add_argument("--merge-file", default="")
    p.add_argument("--append-eod", type=int, default=None, metavar="ID", help="append this id to every document")
    p.add_argument("--lengths", default="", metavar="FILE.npy", help="also save every document's length")
    a = p.parse_args(argv)
    try:
        if not os.path.isfile(a.input):
            raise ZeppelinError(f"--input {a.input} does not exist")
        tok = make_tokenizer(a.tokenizer, a.tokenizer_model, a.vocab_file, a.merge_file)
        n = convert(a.input, a.output_prefix, tok, a.json_key, a.append_eod, a.lengths)
    except ZeppelinError as e:
        print(f"jsonl_to_indexed: error: {e}", file=sys.stderr)
        return 2
    print(f"{a.output_prefix}.bin/.idx: {n} documents ({tok.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
