"""Document lengths of a JSONL file: one JSON object per line whose FIELD holds an integer length or
a text, whose tokens ``--tokenizer`` counts (data/tokenizers.py).

The file is streamed: texts are counted in batches of about ``BATCH_CHARS`` characters (one batched
call of the tokenizer each; only the current batch is held), a progress line goes to stderr when
counting takes long (data/progress.py), and the counts of texts are cached per (file, size, mtime,
field, tokenizer identity) (data/token_cache.py), so the second run on the same file and
tokenizer reads them back instead of tokenizing again.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Iterator, Optional, Tuple

import numpy as np

from megatron_zeppelin.data import token_cache
from megatron_zeppelin.data.errors import WorkloadError
from megatron_zeppelin.data.progress import Progress
from megatron_zeppelin.errors import ZeppelinError

BATCH_CHARS = 1 << 22  # 4M characters of text per tokenizer call


def _error(msg: str) -> ZeppelinError:
    return WorkloadError(msg)


def records(path: str, field: Optional[str], flag: str) -> Iterator[Tuple[int, object, int, str]]:
    """(line number, the field's value, bytes read so far, the field's name) of each non-empty line."""
    with open(path, "rb") as f:
        done = 0
        for n, raw in enumerate(f, 1):
            done += len(raw)
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise _error(f"{path} line {n}: not JSON ({getattr(e, 'msg', e)}); fix {flag}") from None
            key = field or ("length" if isinstance(rec, dict) and "length" in rec else "text")
            if not isinstance(rec, dict) or key not in rec:
                raise _error(f"{path} line {n}: no field '{key}' (name the field as {flag} {path}:FIELD)")
            yield n, rec[key], done, key


def _check_length(path: str, n: int, key: str, v, flag: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
        raise _error(f"{path} line {n}: field '{key}' = {v!r} is not an integer length (fix {flag})")
    return int(v)


def jsonl_lengths(path: str, field: Optional[str], flag: str, tokenizer=None) -> np.ndarray:
    """Every document's length (int64, file order): the integer, or the tokens of the text."""
    from megatron_zeppelin.data.tokenizers import make_tokenizer
    tok = tokenizer or make_tokenizer()
    key = None
    if token_cache.enabled():
        key = token_cache.cache_key(path, field or "", tok.identity or tok.name)
        hit = token_cache.load(key)
        if hit is not None:
            # say so: a user who changed the tokenizer's files or wants a recount must know where
            # the counts came from (stderr: the report on stdout stays the same either way)
            print(f"token counts of {path} ({tok.name}) read from the cache in {token_cache.cache_dir()} "
                  "(ZEPPELIN_CACHE=off counts again)", file=sys.stderr)
            return hit
    out, texts, where, chars = [], [], [], 0
    progress = Progress(f"counting tokens of {path} ({tok.name})", os.path.getsize(path))

    def flush():
        for i, c in zip(where, tok.counts(texts)):
            out[i] = int(c)
        texts.clear()
        where.clear()

    counted = False
    for n, v, done, name in records(path, field, flag):
        if isinstance(v, str):  # a text: its tokens as --tokenizer counts them
            counted = True
            out.append(0)
            texts.append(v)
            where.append(len(out) - 1)
            chars += len(v)
            if chars >= BATCH_CHARS:
                flush()
                chars = 0
                progress.update(done, len(out))
        else:
            out.append(_check_length(path, n, name, v, flag))
    flush()
    progress.finish(os.path.getsize(path))
    x = np.array(out, dtype=np.int64)
    if counted and key is not None:
        token_cache.store(key, x, about={"path": os.path.abspath(path), "field": field or "", "tokenizer": tok.name,
                                         "identity": tok.identity, "documents": int(x.size)})
    return x
