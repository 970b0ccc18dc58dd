"""Counting the tokens of a text document (``--tokenizer``), for JSONL / text datasets whose lengths the
planner needs. Every counter has a ``name`` that the commands print, so a reader knows whether the
lengths are exact token counts or an estimate.

- ``bytes/4`` (default): ceil(UTF-8 bytes / 4), an *estimate* (~4 bytes per token of English prose);
- ``byte``: one token per UTF-8 byte (byte-level tokens, vocab 256, as the embedded training corpus);
- ``NullTokenizer``: Megatron's: the text is whitespace-separated token ids, one token each;
- ``HuggingFaceTokenizer`` with ``--tokenizer-model NAME_OR_PATH`` (Megatron's flags), or the name or
  path directly: a ``tokenizer.json`` file through ``tokenizers``, else ``transformers.AutoTokenizer``
  (a local directory, or a hub name already in the local cache: nothing is downloaded);
- ``GPT2BPETokenizer`` with ``--vocab-file`` and ``--merge-file`` (through ``tokenizers``);
- ``SentencePieceTokenizer`` with ``--tokenizer-model FILE`` (through ``sentencepiece``).

Each also has an ``identity`` (its kind and a digest of the files that define it, not their path),
which the token-count cache keys on (data/token_cache.py), ``counts`` (many texts at once: batched
in the Rust tokenizers, which run them on several threads) and, where the tokenizer has token ids,
``encode`` (for writing an indexed dataset, integration/jsonl_to_indexed.py).

>>> t = make_tokenizer("bytes/4")
>>> t.name, t.count("hello world!"), t.exact, t.encode is None
('bytes/4 estimate (ceil(UTF-8 bytes / 4))', 3, False, True)
>>> make_tokenizer("NullTokenizer").count("17 4 99 3"), make_tokenizer("byte").counts(["ab", "é"])
(4, [2, 2])
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from megatron_zeppelin.errors import ZeppelinError

DEFAULT = "bytes/4"


class TokenizerError(ZeppelinError):
    pass


COUNTING = "v1"  # how texts are counted (no special tokens added); a change here invalidates cached counts


@dataclass(frozen=True)
class TextTokenizer:
    name: str  # what the output says counted the tokens
    count: Callable[[str], int]
    exact: bool = True
    identity: str = ""  # the cache key's tokenizer part: kind + digest of its defining files
    count_batch: Optional[Callable[[List[str]], List[int]]] = None
    encode: Optional[Callable[[str], List[int]]] = None  # token ids; None: the counter has none (an estimate)
    vocab: int = 0  # ids are below this (0: unknown)

    def counts(self, texts: Sequence[str]) -> List[int]:
        """Token counts of many texts (one batched call where the tokenizer has one)."""
        if self.count_batch is not None:
            return list(self.count_batch(list(texts)))
        return [self.count(t) for t in texts]


def _digest(*paths: str) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:32]


def _need(module: str, what: str):
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError:
        raise TokenizerError(f"--tokenizer {what} needs the '{module}' package (pip install {module}), "
                             "or use --tokenizer byte / bytes/4") from None


def _hf(spec: str) -> TextTokenizer:
    if os.path.isfile(spec):  # a tokenizer.json
        tk = _need("tokenizers", spec)
        try:
            tok = tk.Tokenizer.from_file(spec)
        except Exception as e:  # the Rust side raises its own exception types
            raise TokenizerError(f"--tokenizer {spec}: not a tokenizers JSON file ({e})") from None
        return TextTokenizer(f"HuggingFace tokenizers {spec}",
                             lambda s: len(tok.encode(s, add_special_tokens=False).ids),
                             identity=f"tokenizers-json {_digest(spec)} {COUNTING}",
                             count_batch=lambda b: [len(e.ids) for e in tok.encode_batch(b, add_special_tokens=False)],
                             encode=lambda s: tok.encode(s, add_special_tokens=False).ids,
                             vocab=tok.get_vocab_size())
    tf = _need("transformers", spec)
    try:  # local_files_only: a name works when it is cached; never a download
        tok = tf.AutoTokenizer.from_pretrained(spec, local_files_only=True)
    except Exception as e:
        raise TokenizerError(f"--tokenizer {spec}: no such local tokenizer (a tokenizer.json, a directory, or a "
                             f"hub name in the local cache; {type(e).__name__})") from None
    if getattr(tok, "is_fast", False):  # the whole tokenizer, serialised
        ident = hashlib.sha256(tok.backend_tokenizer.to_str().encode()).hexdigest()[:32]
    else:
        ident = hashlib.sha256(repr(sorted(tok.get_vocab().items())).encode()).hexdigest()[:32]
    return TextTokenizer(f"HuggingFace transformers {spec}",
                         lambda s: len(tok(s, add_special_tokens=False)["input_ids"]),
                         identity=f"transformers {type(tok).__name__} {ident} {COUNTING}",
                         count_batch=lambda b: [len(x) for x in tok(b, add_special_tokens=False)["input_ids"]],
                         encode=lambda s: tok(s, add_special_tokens=False)["input_ids"], vocab=len(tok))


def make_tokenizer(spec: Optional[str] = None, model: str = "", vocab_file: str = "",
                   merge_file: str = "") -> TextTokenizer:
    """The counter named by ``--tokenizer`` (see the module docstring); the error names the flag."""
    spec = spec or DEFAULT
    if spec == "bytes/4":
        return TextTokenizer("bytes/4 estimate (ceil(UTF-8 bytes / 4))", lambda s: -(-len(s.encode()) // 4), False,
                             identity=f"bytes/4 {COUNTING}")
    if spec == "byte":
        return TextTokenizer("byte (one token per UTF-8 byte)", lambda s: len(s.encode()), identity=f"byte {COUNTING}",
                             encode=lambda s: list(s.encode()), vocab=256)
    if spec == "NullTokenizer":
        return TextTokenizer("NullTokenizer (whitespace-separated ids)", lambda s: len(s.split()),
                             identity=f"null {COUNTING}", encode=lambda s: [int(x) for x in s.split()])
    if spec == "HuggingFaceTokenizer":
        if not model:
            raise TokenizerError("--tokenizer HuggingFaceTokenizer needs --tokenizer-model NAME_OR_PATH")
        return _hf(model)
    if spec == "GPT2BPETokenizer":
        if not (vocab_file and merge_file):
            raise TokenizerError("--tokenizer GPT2BPETokenizer needs --vocab-file and --merge-file")
        tk = _need("tokenizers", spec)
        try:
            tok = tk.ByteLevelBPETokenizer.from_file(vocab_file, merge_file)
        except Exception as e:
            raise TokenizerError(f"--vocab-file {vocab_file} / --merge-file {merge_file}: {e}") from None
        return TextTokenizer(f"GPT2BPETokenizer {vocab_file}", lambda s: len(tok.encode(s).ids),
                             identity=f"gpt2-bpe {_digest(vocab_file, merge_file)} {COUNTING}",
                             count_batch=lambda b: [len(e.ids) for e in tok.encode_batch(b)],
                             encode=lambda s: tok.encode(s).ids, vocab=tok.get_vocab_size())
    if spec == "SentencePieceTokenizer":
        if not model:
            raise TokenizerError("--tokenizer SentencePieceTokenizer needs --tokenizer-model FILE")
        spm = _need("sentencepiece", spec)
        try:
            sp = spm.SentencePieceProcessor(model_file=model)
        except Exception as e:
            raise TokenizerError(f"--tokenizer-model {model}: not a SentencePiece model ({e})") from None
        return TextTokenizer(f"SentencePieceTokenizer {model}", lambda s: len(sp.encode(s)),
                             identity=f"sentencepiece {_digest(model)} {COUNTING}",
                             count_batch=lambda b: [len(x) for x in sp.encode(b)], encode=lambda s: sp.encode(s),
                             vocab=sp.get_piece_size())
    return _hf(spec)
