"""A blend of datasets, written as Megatron writes one: ``--data-path 0.3 A 0.7 B`` (weight / path
pairs) or ``--data-path A B`` (no weights: every document of every dataset, so each dataset's share
is its size). Each path is any ``--dataset`` file of lengths (usually a Megatron indexed prefix).

The weights are shares of the *tokens* trained, as in Megatron, where a sample is ``--seq-length``
tokens. Zeppelin draws whole documents, so dataset i is drawn with the document weight
``w_i / mean_i`` (``mean_i``: its mean tokens per document), which gives it the share ``w_i`` of the
batch's tokens in expectation. The order in which the datasets take turns is Megatron's own
(``build_blending_indices`` of megatron-core's dataset helpers, restated in ``blend_order``: each
next document comes from the dataset furthest behind its weight, deterministically); within a
dataset the documents come in a seeded random order, a new permutation per pass. The Megatron-LM
entry (integration/blend.py) builds its blend with megatron-core's own BlendedDataset on the same
document weights.

>>> parse_blend(["0.3", "a", "0.7", "b"])
BlendSpec(paths=('a', 'b'), weights=(0.3, 0.7))
>>> parse_blend(["a", "b"]).weights is None, parse_blend(["30", "a", "70", "b"]).weights
(True, (0.3, 0.7))
>>> blend_order([0.25, 0.75], 8).tolist()
[1, 0, 1, 1, 0, 1, 1, 1]
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from megatron_zeppelin.errors import ZeppelinError


class BlendError(ZeppelinError):
    """A blend that cannot be used; names the flag to change."""


def _number(s: str) -> Optional[float]:
    try:
        return float(s)
    except ValueError:
        return None


@dataclass(frozen=True)
class BlendSpec:
    """The paths of a blend and their token shares (normalised), or None: by size."""
    paths: Tuple[str, ...]
    weights: Optional[Tuple[float, ...]]


def parse_blend(items: Sequence[str], flag: str = "--data-path") -> BlendSpec:
    """Megatron's reading of a blend list (``get_blend_from_list``): an even number of items whose
    every other one is a number are weight / path pairs; otherwise every item is a path."""
    items = [str(s).strip() for s in items if str(s).strip()]
    if not items:
        raise BlendError(f"{flag} names no dataset")
    pairs = len(items) % 2 == 0 and all(_number(items[i]) is not None for i in range(0, len(items), 2))
    if not pairs:
        return BlendSpec(tuple(items), None)
    w = [float(items[i]) for i in range(0, len(items), 2)]
    paths = tuple(items[i + 1] for i in range(0, len(items), 2))
    if any(not (x > 0) or x != x or x == float("inf") for x in w):
        raise BlendError(f"{flag}: every weight of a blend must be a positive number, got "
                         f"{' '.join(items[0::2])} (Megatron refuses the same)")
    total = sum(w)
    return BlendSpec(paths, tuple(x / total for x in w))


def is_blend(spec: str) -> bool:
    """True if a ``--dataset`` string is a blend (more than one item, as the flag joins them)."""
    return isinstance(spec, str) and len(spec.split()) > 1 and not os.path.exists(spec)


def blend_order(doc_weights: Sequence[float], n: int) -> np.ndarray:
    """Which dataset each of the first ``n`` documents comes from: megatron-core's
    ``build_blending_indices`` (each step takes the dataset with the largest weight x step - taken;
    the first two steps both count as step 1, as there)."""
    w = np.asarray(doc_weights, dtype=np.float64)
    taken = np.zeros(w.size, dtype=np.float64)
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        j = int(np.argmax(w * max(i, 1) - taken))  # argmax: the first of equal errors, as the C++ loop
        out[i] = j
        taken[j] += 1
    return out


@dataclass(frozen=True)
class Blend:
    """Blended datasets: their spec and each dataset's document lengths (file order)."""
    spec: BlendSpec
    lengths: Tuple[np.ndarray, ...]
    text: str = ""  # the blend as given, for the output

    def token_shares(self) -> np.ndarray:
        """Each dataset's share of the tokens: the weights, or (no weights) its share of all tokens."""
        if self.spec.weights is not None:
            return np.asarray(self.spec.weights, dtype=np.float64)
        t = np.array([x.sum() for x in self.lengths], dtype=np.float64)
        return t / t.sum()

    def doc_weights(self) -> np.ndarray:
        """Probability that a document comes from each dataset: token share / mean tokens per document.

        >>> b = Blend(BlendSpec(("a", "b"), (0.5, 0.5)), (np.array([100] * 4), np.array([900] * 2)))
        >>> b.doc_weights().round(2).tolist()   # equal tokens, 9x more documents of the short dataset
        [0.9, 0.1]
        """
        w = self.token_shares() / np.array([x.mean() for x in self.lengths])
        return w / w.sum()


def load_blend(spec: str, flag: str, read_lengths) -> Blend:
    """The blend named by ``spec`` (items separated by spaces); each path read by ``read_lengths``
    (workloads.read_lengths: any file of lengths or an indexed prefix)."""
    bs = parse_blend(spec.split(), flag)
    if len(set(bs.paths)) != len(bs.paths):
        raise BlendError(f"{flag}: a blend names each dataset once, got {' '.join(bs.paths)}")
    return Blend(bs, tuple(read_lengths(p) for p in bs.paths), " ".join(spec.split()))


def _dataset_stream(lengths: np.ndarray, seed: int, which: int, count: int) -> np.ndarray:
    """The first ``count`` documents of dataset ``which``: seeded permutations, one per pass."""
    rng = np.random.default_rng([seed, which])
    passes = -(-count // lengths.size)
    order = np.concatenate([rng.permutation(lengths.size) for _ in range(max(passes, 1))])[:count]
    return lengths[order]


def blend_documents(blend: Blend, seed: int, n: int) -> np.ndarray:
    """Lengths of the blend's first ``n`` documents (a longer ``n`` extends the same sequence)."""
    order = blend_order(blend.doc_weights(), n)
    out = np.empty(n, dtype=np.int64)
    for j, x in enumerate(blend.lengths):
        m = order == j
        out[m] = _dataset_stream(x, seed, j, int(m.sum()))
    return out


def sample_blend(blend: Blend, tokens: int, seed: int, cut, fill) -> np.ndarray:
    """One global batch of ``tokens`` tokens from the blend: its documents in order, cut by ``cut``
    (to the context length) and filled to the budget by ``fill`` (workloads' functions)."""
    mean = float(np.dot(blend.doc_weights(), [x.mean() for x in blend.lengths]))
    n = int(tokens / mean * 1.25) + 16
    while True:
        docs = cut(blend_documents(blend, seed, n))
        if int(docs.sum()) >= tokens:
            return fill(docs, tokens)
        n *= 2


def describe_blend(blend: Blend, describe_file) -> dict:
    """Whole-blend numbers: per dataset its token share, document weight and file statistics."""
    parts: List[dict] = []
    for p, share, dw, x in zip(blend.spec.paths, blend.token_shares(), blend.doc_weights(), blend.lengths):
        parts.append({"path": p, "token_share": float(share), "document_weight": float(dw), **describe_file(x)})
    return {"kind": "blend", "weighted": blend.spec.weights is not None, "datasets": parts,
            "documents": sum(d["documents"] for d in parts), "tokens": sum(d["tokens"] for d in parts)}
