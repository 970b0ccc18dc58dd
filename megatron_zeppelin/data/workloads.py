"""Workloads: the document lengths of one global batch.

``--dataset`` takes a preset name (a length distribution, megatron_zeppelin/presets/datasets/<name>.yaml: arxiv,
github, prolong64k, fineweb, openwebmath, stackexchange) or a path:

- ``*.yaml`` / ``*.yml``: a distribution written like the presets;
- ``*.npy``: a 1-D integer array of lengths;
- ``*.jsonl[:FIELD]``: one JSON object per line; FIELD (default ``length``, else ``text``) holds an
  integer length, or a string whose tokens ``--tokenizer`` counts (data/tokenizers.py; by default an
  *estimate*, ceil(UTF-8 bytes / 4) tokens, ~4 bytes per token of English prose), streamed, with a
  progress line on long work, the counts cached per (file, size, mtime, tokenizer) (data/jsonl_lengths.py);
- a Megatron indexed dataset prefix (``PREFIX.idx`` / ``.bin``, or either file's path);
- any other file: integers separated by whitespace (e.g. one per line);
- a blend, as Megatron's ``--data-path 0.3 A 0.7 B`` (weight / path pairs, or paths only): documents
  of each path drawn in the blend's token shares (data/blend.py).

A preset is a mixture of lognormals over tokens per document. Each component has a sourced
``mean_tokens`` and an assumed ``sigma`` (no published percentiles were found), a floor
``min_tokens`` and a ``token_share`` (share of the mix's *tokens*; the sampler turns it into a share
of documents). The YAML files state every parameter's source.

Sampling a batch by token budget (``sample_batch``) follows Megatron's GPTDataset: documents are
concatenated in (seeded) random order and cut into samples of the context length, so a document
longer than ``max_len`` becomes pieces of ``max_len`` tokens plus the remainder (no token is
dropped), and the last document is cut where the budget ends (its rest would open the next batch).

>>> cut_to_context(np.array([5, 10, 3]), 4).tolist()     # 10 -> 4 + 4 + 2
[4, 1, 4, 4, 2, 3]
>>> fill_budget(np.array([4, 4, 4]), 10).tolist()          # the last document is cut at the budget
[4, 4, 2]
>>> b = sample_batch("arxiv", 1 << 20, seed=0, max_len=65536)
>>> int(b.sum()), int(b.max()) <= 65536, bool((b > 0).all())
(1048576, True, True)
>>> bool((sample_batch("arxiv", 1 << 20, seed=0, max_len=65536) == b).all())   # same seed, same batch
True
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import yaml

from megatron_zeppelin.spec.yaml_load import safe_load

from megatron_zeppelin.data.jsonl_lengths import jsonl_lengths
from megatron_zeppelin.data.blend import Blend, describe_blend, is_blend, load_blend, sample_blend
from megatron_zeppelin.data.errors import WorkloadError
# Megatron's indexed reader: it imports megatron only when it reads a dataset (only integration/
# imports megatron), and nothing of the package but errors.
from megatron_zeppelin.integration.indexed_lengths import indexed_document_lengths
from megatron_zeppelin.presets import preset_dir

DATASETS_DIR = preset_dir("datasets")
PRESETS = ("arxiv", "github", "prolong64k", "fineweb", "openwebmath", "stackexchange")


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@dataclass(frozen=True)
class Component:
    """Lognormal lengths with the given mean (before the floor) and log-space spread ``sigma``.

    >>> c = Component("x", 1.0, mean_tokens=1000, sigma=1.0)
    >>> round(c.median), round(c.expected_tokens())
    (607, 1000)
    """
    name: str
    token_share: float
    mean_tokens: float
    sigma: float
    min_tokens: int = 1

    @property
    def mu(self) -> float:
        return math.log(self.mean_tokens) - self.sigma ** 2 / 2

    @property
    def median(self) -> float:
        return math.exp(self.mu)

    def expected_tokens(self) -> float:
        """Mean of max(min_tokens, X): the floor moves mass up, which changes the mean."""
        a, mu, s = max(1, self.min_tokens), self.mu, self.sigma
        if s == 0:
            return max(a, self.mean_tokens)
        z = (math.log(a) - mu) / s
        return a * _phi(z) + math.exp(mu + s * s / 2) * (1.0 - _phi(z - s))

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = np.rint(rng.lognormal(self.mu, self.sigma, n))
        return np.maximum(x, max(1, self.min_tokens)).astype(np.int64)


@dataclass(frozen=True)
class Distribution:
    """A mixture of length components (a preset or a user's YAML)."""
    name: str
    components: Tuple[Component, ...]
    description: str = ""

    def doc_weights(self) -> np.ndarray:
        """Probability that a document comes from each component: token share / mean length.

        >>> d = Distribution("m", (Component("short", 0.5, 100, 0.0), Component("long", 0.5, 900, 0.0)))
        >>> d.doc_weights().round(2).tolist()   # equal tokens, 9x more short documents
        [0.9, 0.1]
        """
        w = np.array([c.token_share / c.expected_tokens() for c in self.components])
        return w / w.sum()

    def mean_tokens(self) -> float:
        return float(sum(w * c.expected_tokens() for w, c in zip(self.doc_weights(), self.components)))

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        which = rng.choice(len(self.components), size=n, p=self.doc_weights())
        out = np.empty(n, dtype=np.int64)
        for i, c in enumerate(self.components):
            m = which == i
            out[m] = c.draw(rng, int(m.sum()))
        return out


def distribution_from_dict(d, source: str, flag: str = "--dataset") -> Distribution:
    if not isinstance(d, dict) or not isinstance(d.get("components"), list) or not d["components"]:
        raise WorkloadError(f"malformed dataset distribution {source}: expected a mapping with a non-empty "
                            f"'components' list (fix {flag})")
    comps = []
    for i, c in enumerate(d["components"]):
        try:
            comp = Component(str(c.get("name", i)), float(c["token_share"]), float(c["mean_tokens"]),
                             float(c["sigma"]), int(c.get("min_tokens", 1)))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise WorkloadError(f"malformed dataset distribution {source}: component {i} needs numeric "
                                f"token_share, mean_tokens, sigma ({type(e).__name__}: {e}); fix {flag}") from None
        if comp.token_share <= 0 or comp.mean_tokens < 1 or comp.sigma < 0:
            raise WorkloadError(f"dataset distribution {source}: component {comp.name} needs token_share > 0, "
                                f"mean_tokens >= 1, sigma >= 0 (fix {flag})")
        comps.append(comp)
    return Distribution(str(d.get("name", os.path.basename(source))), tuple(comps), str(d.get("description", "")))


def load_distribution(name_or_path: str, flag: str = "--dataset") -> Distribution:
    path = name_or_path if os.path.isfile(name_or_path) else os.path.join(DATASETS_DIR, f"{name_or_path}.yaml")
    if not os.path.isfile(path) and (os.sep in name_or_path or "." in name_or_path):  # meant a file
        raise WorkloadError(f"dataset file '{name_or_path}' not found (set {flag} to an existing file, an "
                            f"indexed dataset prefix, or a preset: {', '.join(PRESETS)})")
    if not os.path.isfile(path):
        raise WorkloadError(f"unknown dataset preset '{name_or_path}' (set {flag} to one of "
                            f"{', '.join(PRESETS)}, or a path to lengths / a Megatron .idx prefix)")
    try:
        with open(path) as f:
            d = safe_load(f)
    except yaml.YAMLError as e:
        msg = " ".join(str(e).split())  # one line: YAML errors span several
        raise WorkloadError(f"malformed dataset distribution {path}: {msg} (fix {flag})") from None
    return distribution_from_dict(d, path, flag)


# --- real lengths from files ------------------------------------------------------------------
def _text_lengths(path: str, flag: str) -> np.ndarray:
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            for tok in line.split():
                try:
                    out.append(int(tok))
                except ValueError:
                    raise WorkloadError(f"{path} line {n}: '{tok[:40]}' is not an integer length; expected "
                                        f"integers separated by whitespace (fix {flag})") from None
    return np.array(out, dtype=np.int64)


def _indexed_prefix(spec: str) -> Optional[str]:
    for p in (spec, spec[:-4] if spec.endswith((".idx", ".bin")) else None):
        if p and os.path.isfile(p + ".idx"):
            return p
    return None


def is_file_spec(spec: str) -> bool:
    """True if ``--dataset`` names lengths in a file (not a preset)."""
    return _indexed_prefix(spec) is not None or os.path.isfile(spec) or \
        (":" in spec and os.path.isfile(spec.rsplit(":", 1)[0]))


def read_lengths(spec: str, flag: str = "--dataset", tokenizer=None) -> np.ndarray:
    """Document lengths from a file (see the module docstring for formats), validated: a non-empty
    1-D array of positive integers in file order."""
    prefix = _indexed_prefix(spec)
    if prefix is not None:
        x = indexed_document_lengths(prefix, flag)
        path = prefix + ".idx"
    else:
        path, field = spec, None
        if not os.path.isfile(spec) and ":" in spec:
            path, field = spec.rsplit(":", 1)
        if not os.path.isfile(path):
            raise WorkloadError(f"dataset file '{spec}' not found (set {flag} to a preset: "
                                f"{', '.join(PRESETS)}, or an existing file)")
        if path.endswith(".npy"):
            try:
                x = np.load(path, allow_pickle=False)
            except (ValueError, OSError) as e:
                raise WorkloadError(f"malformed .npy {path}: {e} (fix {flag})") from None
            if x.ndim != 1 or x.dtype.kind not in "iuf" or (x.dtype.kind == "f" and not np.all(x == np.round(x))):
                raise WorkloadError(f"{path}: expected a 1-D array of integer lengths, got {x.dtype} "
                                    f"shape {x.shape} (fix {flag})")
        elif path.endswith(".jsonl"):
            x = jsonl_lengths(path, field, flag, tokenizer)
        else:
            x = _text_lengths(path, flag)
    x = np.asarray(x).astype(np.int64)
    if x.size == 0:
        raise WorkloadError(f"{path} holds no document lengths (fix {flag})")
    bad = np.flatnonzero(x <= 0)
    if bad.size:
        raise WorkloadError(f"{path}: document {bad[0]} has length {x[bad[0]]}; every length must be a "
                            f"positive integer ({bad.size} bad; fix {flag})")
    return x


# --- cutting and sampling ---------------------------------------------------------------------
def cut_to_context(lengths: np.ndarray, max_len: Optional[int]) -> np.ndarray:
    """Split every document longer than ``max_len`` into ``max_len`` pieces plus the remainder."""
    x = np.asarray(lengths, dtype=np.int64)
    if not max_len or x.size == 0 or x.max() <= max_len:
        return x
    pieces = -(-x // max_len)
    out = np.full(int(pieces.sum()), max_len, dtype=np.int64)
    out[np.cumsum(pieces) - 1] = x - (pieces - 1) * max_len  # last piece of each document
    return out


def fill_budget(lengths: np.ndarray, tokens: int) -> np.ndarray:
    """The shortest prefix holding ``tokens`` tokens, its last document cut to fit exactly."""
    cs = np.cumsum(lengths)
    k = int(np.searchsorted(cs, tokens))  # first index with cs[k] >= tokens
    out = np.array(lengths[:k + 1], dtype=np.int64)
    out[-1] -= int(cs[k]) - tokens
    return out


def load_source(name_or_path: str, flag: str = "--dataset", tokenizer=None):
    """What batches are drawn from: a file's document lengths (int64 array, in file order), a blend
    of such files, or a preset / YAML length distribution. Load it once to sample many batches
    (``--seeds``)."""
    if is_file_spec(name_or_path) and not name_or_path.endswith((".yaml", ".yml")):
        return read_lengths(name_or_path, flag, tokenizer)
    if is_blend(name_or_path):
        return load_blend(name_or_path, flag, lambda p: _blend_part(p, flag, tokenizer))
    return load_distribution(name_or_path, flag)


def _blend_part(path: str, flag: str, tokenizer) -> np.ndarray:
    if not is_file_spec(path) or path.endswith((".yaml", ".yml")):
        raise WorkloadError(f"blend entry '{path}' is not a file of lengths or an indexed dataset prefix "
                            f"(a blend mixes datasets on disk; fix {flag})")
    return read_lengths(path, flag, tokenizer)


def sample_batch(source, tokens: int, seed: int, max_len: Optional[int] = None,
                 flag: str = "--dataset", tokenizer=None) -> np.ndarray:
    """Lengths of one global batch of exactly ``tokens`` tokens (int64), reproducible from ``seed``.

    ``source`` is a ``--dataset`` spec or what ``load_source`` returned. A preset draws documents
    from its distribution. A file's documents are visited in a seeded random order (a new permutation
    each pass, like Megatron's shuffled document index); with ``tokens == 0`` the whole file is the
    batch, in file order.
    """
    if max_len is not None and max_len < 0:
        raise WorkloadError(f"context length must be >= 0 (0 = no cut), got {max_len} (fix --context-length)")
    lengths_file = (isinstance(source, np.ndarray) or
                    (isinstance(source, str) and is_file_spec(source) and not source.endswith((".yaml", ".yml"))))
    if tokens < 0 or (tokens == 0 and not lengths_file):
        raise WorkloadError(f"global batch must be > 0 tokens, got {tokens} (fix --global-batch-tokens; "
                            "0 means 'the whole file' only for a file of lengths)")
    if isinstance(source, str):
        source = load_source(source, flag, tokenizer)
    if isinstance(source, Blend):
        if tokens == 0:
            raise WorkloadError("--global-batch-tokens 0 takes a whole file as the batch; a blend needs a "
                                "token budget (set --global-batch-tokens)")
        return sample_blend(source, tokens, seed, lambda x: cut_to_context(x, max_len), fill_budget)
    rng = np.random.default_rng(seed)
    if lengths_file:
        src = source
        if tokens == 0:
            return cut_to_context(src, max_len)
        draw = lambda: src[rng.permutation(src.size)]  # noqa: E731 - one pass over the file
    else:
        dist = source
        block = int(tokens / dist.mean_tokens() * 1.25) + 16  # enough for one block most of the time
        draw = lambda: dist.draw(rng, block)  # noqa: E731
    parts, total = [], 0
    while total < tokens:
        p = cut_to_context(draw(), max_len)
        parts.append(p)
        total += int(p.sum())
    return fill_budget(np.concatenate(parts), tokens)


def describe_source(source) -> dict:
    """Whole-dataset numbers of what batches are drawn from: for a file, its documents, tokens and
    length percentiles (before any cut to the context length); for a distribution, its mean.

    >>> describe_source(np.arange(1, 101))["p90"], describe_source(np.arange(1, 101))["tokens"]
    (90, 5050)
    """
    if isinstance(source, Blend):
        return describe_blend(source, describe_source)
    if isinstance(source, np.ndarray):
        x = source
        pct = {f"p{q}": int(np.percentile(x, q, method="inverted_cdf")) for q in (50, 90, 99)}
        return {"kind": "file", "documents": int(x.size), "tokens": int(x.sum()), "min": int(x.min()), **pct,
                "max": int(x.max()), "mean": float(x.mean())}
    return {"kind": "distribution", "name": source.name, "mean": source.mean_tokens(),
            "components": len(source.components)}


def describe_batch(lengths: np.ndarray) -> dict:
    """Summary numbers of a batch (for printing and JSON).

    >>> describe_batch(np.array([1, 2, 3, 10]))
    {'documents': 4, 'tokens': 16, 'min': 1, 'median': 2.5, 'mean': 4.0, 'max': 10}
    """
    x = np.asarray(lengths)
    return {"documents": int(x.size), "tokens": int(x.sum()), "min": int(x.min()),
            "median": float(np.median(x)), "mean": float(x.mean()), "max": int(x.max())}
