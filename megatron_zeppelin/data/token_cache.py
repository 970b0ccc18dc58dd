"""Token counts of a text dataset, cached: counting a large JSONL with a real tokenizer takes
minutes, so the counts are kept per (file path, size, modification time, field, tokenizer identity)
and the next run reads them back in milliseconds. A changed file (size or mtime) or a different
tokenizer (its identity is a digest of the files that define it, data/tokenizers.py) misses the
cache and counts again.

Where: ``$ZEPPELIN_CACHE`` if set (the directory the embedded training corpus also uses), else
``$XDG_CACHE_HOME/megatron_zeppelin``, else ``~/.cache/megatron_zeppelin``; counts go under its
``token_counts/`` as ``<key>.npy`` (int64 lengths in file order) beside ``<key>.json`` (what the key
was made of). ``ZEPPELIN_CACHE=off`` disables the token-count cache (the corpus then lives under XDG). Writes are atomic (a temporary file renamed),
so concurrent runs never read half a file.

>>> import tempfile, numpy as np
>>> d = tempfile.mkdtemp()
>>> f = os.path.join(d, "a.jsonl"); _ = open(f, "w").write("x")
>>> k = cache_key(f, "text", "byte v1")
>>> load(k, d) is None
True
>>> store(k, np.array([3, 4]), d, {"path": f}); load(k, d).tolist()
[3, 4]
>>> cache_key(f, "text", "bytes/4 v1") == k   # another tokenizer, another key
False
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Optional

import numpy as np

VERSION = 1


def cache_dir() -> str:
    """The project's cache directory (``$ZEPPELIN_CACHE``, XDG, or ``~/.cache/megatron_zeppelin``)."""
    if os.environ.get("ZEPPELIN_CACHE") and enabled():
        return os.environ["ZEPPELIN_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "megatron_zeppelin")


def enabled() -> bool:
    return os.environ.get("ZEPPELIN_CACHE", "").lower() not in ("off", "0", "none")


def cache_key(path: str, field: str, tokenizer_identity: str) -> str:
    st = os.stat(path)
    parts = [VERSION, os.path.abspath(path), st.st_size, st.st_mtime_ns, field, tokenizer_identity]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:40]


def _where(key: str, root: Optional[str]) -> str:
    return os.path.join(root or cache_dir(), "token_counts", key)


def load(key: str, root: Optional[str] = None) -> Optional[np.ndarray]:
    """The cached counts of ``key``, or None (a missing or unreadable entry is a miss)."""
    try:
        x = np.load(_where(key, root) + ".npy", allow_pickle=False)
    except (OSError, ValueError):
        return None
    return x.astype(np.int64) if x.ndim == 1 else None


def store(key: str, lengths: np.ndarray, root: Optional[str] = None, about: Optional[dict] = None) -> None:
    """Keep ``lengths`` under ``key``; a cache that cannot be written is skipped (counting still worked)."""
    base = _where(key, root)
    try:
        os.makedirs(os.path.dirname(base), exist_ok=True)
        tmp = f"{base}.tmp{os.getpid()}"
        with open(tmp + ".json", "w") as f:
            json.dump(about or {}, f)
        os.replace(tmp + ".json", base + ".json")
        with open(tmp + ".npy", "wb") as f:
            np.save(f, np.asarray(lengths, dtype=np.int64))
        os.replace(tmp + ".npy", base + ".npy")
    except OSError:
        pass
