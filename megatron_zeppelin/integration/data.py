r"""Training data: Megatron indexed datasets with documents kept whole, and the embedded corpus.

A *document* is Megatron's document (``document_indices``: one or more sequences); its boundaries
are the attention boundaries. Batches are filled with whole documents (cut only when a document is
longer than ``max_doc_tokens``) up to a token budget, in a seeded order that depends only on
(seed, step): resuming at step k replays exactly the batches of an uninterrupted run.

The embedded default corpus (no download): the Python standard library's own ``.py`` files, cut at
top-level ``def`` / ``class`` / decorator lines into one document per top-level block (a real,
long-tailed, code-like length distribution: most blocks are short, a few are very long), byte-level
tokens (vocab 256), written once as a Megatron indexed dataset under the cache directory.

>>> src = b"import os, sys\n\n@cache\ndef f():\n    pass\n\nclass A:\n    x = 1\n"
>>> [b.split(b"\n")[0] for b in top_level_blocks(src)], b"".join(top_level_blocks(src)) == src
([b'import os, sys', b'@cache', b'class A:'], True)

>>> s = BatchSampler([5, 300, 40, 12, 7, 90], tokens_per_batch=100, max_doc_tokens=64, seed=0)
>>> [sum(n for _, n in s.batch(i)) for i in range(4)], max(n for i in range(4) for _, n in s.batch(i))
([100, 100, 100, 100], 64)
>>> s.batch(3) == BatchSampler([5, 300, 40, 12, 7, 90], 100, 64, seed=0).batch(3)   # (seed, step) only
True
"""

from __future__ import annotations

import glob
import os
import re
import sysconfig
from typing import List, Sequence, Tuple

import numpy as np
import torch

from megatron_zeppelin.errors import ZeppelinError


class DataError(ZeppelinError):
    pass


def cache_dir() -> str:
    """data/token_cache.py's: ``$ZEPPELIN_CACHE``, else ``$XDG_CACHE_HOME/megatron_zeppelin``, else ~/.cache/..."""
    from megatron_zeppelin.data.token_cache import cache_dir as where
    return where()


def open_indexed(prefix: str):
    """megatron-core's IndexedDataset at ``prefix`` (.bin/.idx), with a clear error otherwise."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    if prefix.endswith((".bin", ".idx")):
        prefix = prefix[:-4]
    missing = [p for p in (prefix + ".bin", prefix + ".idx") if not os.path.exists(p)]
    if missing:
        raise DataError(f"--data-path {prefix}: {missing[0]} does not exist (give the prefix of a Megatron "
                        "indexed dataset, PREFIX.bin + PREFIX.idx, or omit --data-path for the embedded corpus)")
    try:
        return IndexedDataset(prefix)
    except Exception as e:  # a wrong magic number / truncated index surfaces as various errors
        raise DataError(f"--data-path {prefix}: not a Megatron indexed dataset ({type(e).__name__}: {e})") from None


class DocumentDataset:
    """Whole documents of an indexed dataset as token tensors."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.ds = open_indexed(prefix)
        self.doc_index = np.asarray(self.ds.document_indices)
        seq_len = np.asarray(self.ds.sequence_lengths, dtype=np.int64)
        csum = np.concatenate([[0], np.cumsum(seq_len)])
        self.lengths = (csum[self.doc_index[1:]] - csum[self.doc_index[:-1]]).tolist()
        if not self.lengths:
            raise DataError(f"--data-path {prefix}: the dataset holds no documents")

    def __len__(self) -> int:
        return len(self.lengths)

    def check_vocab(self, vocab: int, model: str = "the model") -> None:
        """Every token id below ``vocab`` (else the embedding fails with an IndexError on some rank, some
        step): one pass over the .bin in chunks."""
        base = self.prefix[:-4] if self.prefix.endswith((".bin", ".idx")) else self.prefix
        x = np.memmap(base + ".bin", dtype=self.ds.index.dtype, mode="r")
        chunk = 1 << 26
        for a in range(0, x.size, chunk):
            part = x[a:a + chunk]
            top = int(part.max()) if part.size else 0
            if top >= vocab:
                pos = a + int(np.argmax(part >= vocab))
                raise DataError(f"--data-path {self.prefix}: token id {top} (first out-of-range id at token "
                                f"{pos}) is beyond {model}'s vocabulary of {vocab} (choose a --model whose vocab "
                                "covers the tokenizer's, or re-tokenize the data)")

    def document(self, i: int, max_tokens: int = 0) -> torch.Tensor:
        a, b = int(self.doc_index[i]), int(self.doc_index[i + 1])
        parts, n = [], 0
        for s in range(a, b):
            x = np.asarray(self.ds[s])
            parts.append(x)
            n += x.size
            if max_tokens and n >= max_tokens:
                break
        doc = np.concatenate(parts) if len(parts) > 1 else parts[0]
        if max_tokens:
            doc = doc[:max_tokens]
        return torch.from_numpy(doc.astype(np.int64))


class BatchSampler:
    """Global micro-batches of documents: step i -> [(document id, trained tokens)], exactly
    ``tokens_per_batch`` trained tokens per step (the last document of a step is cut to fit, and
    documents longer than ``max_doc_tokens`` are cut to it). Seeded; depends on (seed, step) only."""

    def __init__(self, lengths: Sequence[int], tokens_per_batch: int, max_doc_tokens: int, seed: int = 0):
        self.lengths = [int(x) for x in lengths]
        self.budget, self.cap, self.seed = int(tokens_per_batch), int(max_doc_tokens), int(seed)
        if self.budget < 1:
            raise DataError(f"tokens per batch must be >= 1, got {self.budget} (set --global-batch-tokens)")
        self.usable = [i for i, L in enumerate(self.lengths) if L >= 2]  # a document trains L-1 tokens
        if not self.usable:
            raise DataError("no document has 2 or more tokens")
        self._batches: List[List[Tuple[int, int]]] = []
        self._epoch, self._pos, self._order = 0, 0, self._perm(0)

    def _perm(self, epoch: int):
        rng = np.random.default_rng([self.seed, epoch])
        return [self.usable[i] for i in rng.permutation(len(self.usable))]

    def _next_document(self) -> Tuple[object, int]:
        """(document key, tokens) of the next document in the sampler's order."""
        if self._pos == len(self._order):
            self._epoch += 1
            self._pos, self._order = 0, self._perm(self._epoch)
        d = self._order[self._pos]
        self._pos += 1
        return d, self.lengths[d]

    def _next_batch(self) -> List[Tuple[int, int]]:
        out, tok = [], 0
        while tok < self.budget:
            d, length = self._next_document()
            n = min(length - 1, self.cap or length, self.budget - tok)
            out.append((d, n))
            tok += n
        return out

    def batch(self, step: int) -> List[Tuple[int, int]]:
        while len(self._batches) <= step:
            self._batches.append(self._next_batch())
        return self._batches[step]


class StreamSampler(BatchSampler):
    """Global micro-batches filled as BatchSampler fills them, from the documents of a stream in its
    order (``stream[k]`` = (key, tokens), every document of 2 or more tokens: integration/blend.py
    ``DocumentStream``, the documents Megatron's blended datasets yield). Depends on the step only."""

    def __init__(self, stream, tokens_per_batch: int, max_doc_tokens: int):
        self.stream, self.budget, self.cap = stream, int(tokens_per_batch), int(max_doc_tokens)
        if self.budget < 1:
            raise DataError(f"tokens per batch must be >= 1, got {self.budget} (set --seq-length)")
        self._batches: List[List[Tuple[object, int]]] = []
        self._k = 0

    def _next_document(self) -> Tuple[object, int]:
        key, length = self.stream[self._k]
        self._k += 1
        return key, length


class JointBatches:
    """Global micro-batches ``k`` at a time (one iteration's global batch, as ``batches`` yields them
    in data order), regrouped by ``order`` and yielded one by one: ``order(lengths)`` takes the k
    micro-batches' document lengths and returns each new micro-batch's documents as indices into
    their documents in data order (``--zeppelin-accumulation joint`` / ``by_length`` / ``rounds``:
    planner/accumulation.py ``joint_indices``). An iteration keeps its documents, only which
    micro-batch holds each changes, and every rank regroups alike (``order`` is a pure function of the
    lengths). A last, partial iteration is regrouped over the micro-batches it has. Where ``order``
    returns fewer micro-batches than it was given (``rounds``: fewer rounds hold the iteration),
    Megatron still runs its k forward steps: the first ones are empty (no documents: the forward step
    runs no layer, integration/megatron_lm.py ``forward_step``), so the last, which starts the
    gradient reduce, trains documents.

    >>> order = lambda lengths: [[0, 3], [1, 2]]            # as if planned: the two long ones apart
    >>> list(JointBatches(iter([[9, 1], [2, 8]]), 2, order, lengths_of=list))
    [[9, 8], [1, 2]]
    >>> list(JointBatches(iter([[9, 1], [2, 8]]), 2, lambda lengths: [[0, 1, 2, 3]], lengths_of=list))
    [[], [9, 1, 2, 8]]
    """

    def __init__(self, batches, k: int, order, lengths_of):
        if k < 1:
            raise DataError(f"an iteration needs at least one micro-batch, got {k}")
        self._it, self.k, self._order, self._lengths_of = iter(batches), int(k), order, lengths_of
        self._ready: List[list] = []

    def __iter__(self):
        return self

    def __next__(self):
        if not self._ready:
            steps = []
            for _ in range(self.k):
                try:
                    steps.append(next(self._it))
                except StopIteration:
                    break
            if not steps:
                raise StopIteration
            docs = [d for s in steps for d in s]
            self._ready = [[docs[i] for i in m] for m in self._order([list(self._lengths_of(s)) for s in steps])]
            self._ready[:0] = [[] for _ in range(len(steps) - len(self._ready))]
        return self._ready.pop(0)


def batch_documents(ds: DocumentDataset, sampler: BatchSampler, step: int) -> List[torch.Tensor]:
    """Token tensors of global micro-batch ``step``: n+1 tokens for a document training n."""
    return [ds.document(d, n + 1) for d, n in sampler.batch(step)]


def stdlib_files() -> List[str]:
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
    return [f for f in files if "site-packages" not in f and os.sep + "test" not in f[len(root):]]


_TOP = re.compile(rb"\n(?=(?:async def |def |class |@))")


def top_level_blocks(data: bytes) -> List[bytes]:
    """Split a source file before each top-level def/class/decorator line (decorators stay with
    what they decorate)."""
    parts = _TOP.split(data)
    out: List[bytes] = []
    for i, p in enumerate(parts):
        p = p + b"\n" if i < len(parts) - 1 else p  # the split ate the newline before the block
        if out and all(ln.startswith(b"@") for ln in out[-1].strip().split(b"\n")):
            out[-1] += p  # decorator line(s) + the def they decorate
        else:
            out.append(p)
    return out


def build_corpus(prefix: str, max_files: int = 0) -> str:
    """Write the embedded corpus (stdlib sources, byte tokens) as an indexed dataset at ``prefix``."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    files = stdlib_files()
    if max_files:
        files = files[:max_files]
    if not files:
        raise DataError("no Python standard library sources found for the embedded corpus: pass --data-path")
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    tmp = f"{prefix}.tmp{os.getpid()}"
    builder = IndexedDatasetBuilder(tmp + ".bin", dtype=np.uint8)
    for f in files:
        with open(f, "rb") as fh:
            blocks = top_level_blocks(fh.read())
        for b in blocks:
            if len(b) < 16:
                continue
            data = np.frombuffer(b, dtype=np.uint8)
            builder.add_document(torch.from_numpy(data.copy()), [int(data.size)])
    builder.finalize(tmp + ".idx")
    # Rename .bin before .idx: a reader that sees the .idx sees a complete pair.
    os.replace(tmp + ".bin", prefix + ".bin")
    os.replace(tmp + ".idx", prefix + ".idx")
    return prefix


def default_corpus(prefix: str = "") -> str:
    """Prefix of the embedded corpus, building it on first use."""
    prefix = prefix or os.path.join(cache_dir(), "stdlib_blocks_v1")
    if not (os.path.exists(prefix + ".bin") and os.path.exists(prefix + ".idx")):
        build_corpus(prefix)
    return prefix
