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

>>> t = make_tokenizer("bytes/4")
>>> t.name, t.count("hello world!"), t.exact
('bytes/4 estimate (ceil(UTF-8 bytes / 4))', 3, False)
>>> make_tokenizer("NullTokenizer").count("17 4 99 3")
4
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

from megatron_zeppelin.errors import ZeppelinError

DEFAULT = "bytes/4"


class TokenizerError(ZeppelinError):
    pass


@dataclass(frozen=True)
class TextTokenizer:
    name: str  # what the output says counted the tokens
    count: Callable[[str], int]
    exact: bool = True


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
                             lambda s: len(tok.encode(s, add_special_tokens=False).ids))
    tf = _need("transformers", spec)
    try:  # local_files_only: a name works when it is cached; never a download
        tok = tf.AutoTokenizer.from_pretrained(spec, local_files_only=True)
    except Exception as e:
        raise TokenizerError(f"--tokenizer {spec}: no such local tokenizer (a tokenizer.json, a directory, or a "
                             f"hub name in the local cache; {type(e).__name__})") from None
    return TextTokenizer(f"HuggingFace transformers {spec}",
                         lambda s: len(tok(s, add_special_tokens=False)["input_ids"]))


def make_tokenizer(spec: Optional[str] = None, model: str = "", vocab_file: str = "",
                   merge_file: str = "") -> TextTokenizer:
    """The counter named by ``--tokenizer`` (see the module docstring); the error names the flag."""
    spec = spec or DEFAULT
    if spec == "bytes/4":
        return TextTokenizer("bytes/4 estimate (ceil(UTF-8 bytes / 4))", lambda s: -(-len(s.encode()) // 4), False)
    if spec == "byte":
        return TextTokenizer("byte (one token per UTF-8 byte)", lambda s: len(s.encode()))
    if spec == "NullTokenizer":
        return TextTokenizer("NullTokenizer (whitespace-separated ids)", lambda s: len(s.split()))
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
        return TextTokenizer(f"GPT2BPETokenizer {vocab_file}", lambda s: len(tok.encode(s).ids))
    if spec == "SentencePieceTokenizer":
        if not model:
            raise TokenizerError("--tokenizer SentencePieceTokenizer needs --tokenizer-model FILE")
        spm = _need("sentencepiece", spec)
        try:
            sp = spm.SentencePieceProcessor(model_file=model)
        except Exception as e:
            raise TokenizerError(f"--tokenizer-model {model}: not a SentencePiece model ({e})") from None
        return TextTokenizer(f"SentencePieceTokenizer {model}", lambda s: len(sp.encode(s)))
    return _hf(spec)
