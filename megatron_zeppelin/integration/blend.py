"""Megatron's data blends for the Megatron-LM entry, with whole documents.

The entry takes Megatron's data flags as pretrain_gpt.py does: ``--data-path PREFIX``, a blend
``--data-path 0.3 A 0.7 B`` (or ``A B``: every document of each), ``--data-args-path FILE``, and
per-split blends ``--train-data-path`` / ``--valid-data-path`` / ``--test-data-path`` or
``--per-split-data-args-path`` (read by megatron-core's ``get_blend_from_list``), and builds the
splits with megatron-core's own ``BlendedMegatronDatasetBuilder``: ``--split`` divides each prefix's
documents, and a blend is megatron-core's ``BlendedDataset`` (its ``build_blending_indices`` decides
which dataset each next sample comes from).

What differs from pretrain_gpt.py is the sample: GPTDataset's is ``--seq-length`` tokens cut from
concatenated documents; here (``WholeDocuments``) it is one whole document, and Zeppelin plans
whatever documents the blended sampler yields (integration/data.py ``StreamSampler`` fills each
global micro-batch with them). So that a blend's weights keep Megatron's meaning, shares of the
tokens trained, dataset i is blended with the document weight ``w_i / mean_i`` (``mean_i``: its mean
trained tokens per document, each cut at ``--max-position-embeddings``), as data/blend.py does for
``zeppelin plan``.

Order: a split's documents come in seeded permutations, one per epoch, seed ``--seed`` + the split's
index (train 0, validation 1): with one prefix the batches are those the entry trained before blends.
Past the end of a BlendedDataset (sized for the run's samples) its dataset order repeats with each
dataset's following documents (their next epochs), so a run never runs out of documents.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import numpy as np

from megatron.core.datasets.megatron_dataset import MegatronDataset

from megatron_zeppelin.errors import ZeppelinError

SPLITS = ("train", "valid", "test")


def blend_from_args(args):
    """(blend, blend_per_split) of Megatron's data flags, as megatron.training's
    ``get_blend_and_blend_per_split`` reads them (without importing megatron.training); the errors
    name the flag."""
    import json

    from megatron.core.datasets.utils import get_blend_from_list

    def read(path, flag):
        try:
            with open(path) as f:
                return f.read()
        except OSError as e:
            raise ZeppelinError(f"{flag} {path}: {e.strerror}") from None

    data_path, args_path = getattr(args, "data_path", None), getattr(args, "data_args_path", None)
    per_split = [getattr(args, f"{s}_data_path", None) for s in SPLITS]
    per_split_path = getattr(args, "per_split_data_args_path", None)
    if (data_path or args_path) and (any(per_split) or per_split_path):
        raise ZeppelinError("give --data-path / --data-args-path or the per-split --train-data-path ... / "
                            "--per-split-data-args-path, not both")
    if data_path and args_path:
        raise ZeppelinError("give --data-path or --data-args-path, not both")
    if args_path:
        return get_blend_from_list(read(args_path, "--data-args-path").split()), None
    if data_path:
        return get_blend_from_list(list(data_path)), None
    if per_split_path:
        try:
            d = json.loads(read(per_split_path, "--per-split-data-args-path"))
            lists = [d[s].split() if isinstance(d[s], str) else d[s] for s in SPLITS]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ZeppelinError(f"--per-split-data-args-path {per_split_path}: expected JSON with 'train', 'valid' "
                                f"and 'test' lists ({type(e).__name__}: {e})") from None
        return None, [get_blend_from_list(x) if x else None for x in lists]
    if any(per_split):
        return None, [get_blend_from_list(x) if x else None for x in per_split]
    return None, None


class WholeDocuments(MegatronDataset):
    """One split of one indexed dataset (a DocumentDataset, integration/data.py) as whole documents:
    sample i is ``{"document": id, "length": tokens}``, epoch e = a seeded permutation of the split's
    documents of 2 or more tokens (a document trains its tokens after the first). Any i >= 0 can be
    read (epochs are made on demand); ``len`` is the samples asked for (one epoch if none)."""

    def __init__(self, dataset, dataset_path, indices, num_samples, index_split, config):
        super().__init__(dataset, dataset_path, indices, num_samples, index_split, config)
        lengths = np.asarray(dataset.lengths, dtype=np.int64)
        idx = np.asarray(indices, dtype=np.int64)
        self.lengths = lengths
        self.usable = idx[lengths[idx] >= 2]  # may be empty: the split is then left out (len 0)
        self.seed = int(config.random_seed) + index_split.value
        self._epoch, self._order = -1, None

    @staticmethod
    def numel_low_level_dataset(low_level_dataset) -> int:
        return len(low_level_dataset)

    @staticmethod
    def build_low_level_dataset(dataset_path, config):
        from megatron_zeppelin.integration.data import DocumentDataset
        return DocumentDataset(dataset_path)

    def __len__(self) -> int:
        if self.usable.size == 0:
            return 0
        return int(self.num_samples) if self.num_samples is not None else int(self.usable.size)

    def document(self, i: int) -> Tuple[int, int]:
        if self.usable.size == 0:
            raise ZeppelinError(f"--data-path {self.dataset_path}: its {self.index_split.name} split holds no "
                                "document of 2 or more tokens (change --split)")
        epoch, pos = divmod(int(i), self.usable.size)
        if epoch != self._epoch:
            self._epoch = epoch
            self._order = self.usable[np.random.default_rng([self.seed, epoch]).permutation(self.usable.size)]
        d = int(self._order[pos])
        return d, int(self.lengths[d])

    def __getitem__(self, i: int):
        d, n = self.document(i)
        return {"document": d, "length": n}


class DocumentStream:
    """The documents a split yields, in order: ``stream[k]`` = ((dataset, document id), tokens), from
    a WholeDocuments split or a BlendedDataset of them (its dataset order, extended past its end);
    ``document(key, max_tokens)`` reads a document's tokens."""

    def __init__(self, top):
        if isinstance(top, WholeDocuments):
            self.parts, self.index = [top], None
        else:  # megatron-core's BlendedDataset
            self.parts = list(top.datasets)
            self.index = np.asarray(top.dataset_index, dtype=np.int64)
            self.sample = np.asarray(top.dataset_sample_index, dtype=np.int64)
            self.counts = np.bincount(self.index, minlength=len(self.parts))
            if self.index.size == 0:
                raise ZeppelinError("the blend yields no documents (raise the run's samples or fix --data-path)")

    def __getitem__(self, k: int):
        if self.index is None:
            d, n = self.parts[0].document(k)
            return (0, d), n
        r, i = divmod(int(k), self.index.size)
        which = int(self.index[i])
        d, n = self.parts[which].document(int(self.sample[i]) + r * int(self.counts[which]))
        return (which, d), n

    def document(self, key, max_tokens: int = 0):
        which, d = key
        return self.parts[which].dataset.document(d, max_tokens)

    def describe(self) -> str:
        """One line: the datasets and the share of the stream's first documents each gave."""
        if self.index is None:
            return f"{self.parts[0].dataset_path} ({self.parts[0].usable.size} documents)"
        share = self.counts / self.counts.sum()
        return ", ".join(f"{p.dataset_path} ({p.usable.size} documents, {s:.3f} of the blended documents)"
                         for p, s in zip(self.parts, share))


def trained_tokens(lengths: np.ndarray, max_doc_tokens: int) -> np.ndarray:
    """Tokens each usable document trains: L - 1, at most ``max_doc_tokens``.

    >>> trained_tokens(np.array([1, 5, 300]), 64).tolist()
    [4, 64]
    """
    x = np.asarray(lengths, dtype=np.int64)
    x = x[x >= 2] - 1
    return np.minimum(x, max_doc_tokens) if max_doc_tokens else x


def document_weights(prefixes: Sequence[str], token_weights: Optional[Sequence[float]], max_doc_tokens: int):
    """(document weights to blend with, mean trained tokens per blended document): a dataset's
    token share over its mean trained tokens per document; without weights None (Megatron then
    blends one epoch of each, in proportion to their documents)."""
    from megatron_zeppelin.integration.indexed_lengths import indexed_document_lengths

    per = [trained_tokens(indexed_document_lengths(p, "--data-path"), max_doc_tokens) for p in prefixes]
    means = np.array([x.mean() if x.size else 1.0 for x in per])
    if token_weights is None:
        n = np.array([x.size for x in per], dtype=np.float64)
        return None, float(np.dot(n / max(n.sum(), 1.0), means))
    w = np.asarray(token_weights, dtype=np.float64) / means
    w = w / w.sum()
    return [float(x) for x in w], float(np.dot(w, means))


def documents_needed(samples: int, samples_per_step: int, tokens_per_step: int, mean_doc: float) -> int:
    """Documents a split is sized for: its steps x (documents of a step + the one cut at its end),
    10% over (past them the stream goes on; this only sizes megatron-core's blending index).

    >>> documents_needed(16, 4, 256, 32.0)   # 4 steps x (8 + 1) x 1.1, + 16
    56
    """
    steps = max(1, -(-int(samples or 0) // samples_per_step))
    return int(math.ceil(steps * (tokens_per_step / max(mean_doc, 1.0) + 1) * 1.1)) + 16


def build_document_splits(args, num_samples: Sequence[int], samples_per_step: int, tokens_per_step: int,
                          max_doc_tokens: int):
    """[train, valid, test] DocumentStreams (None for a split with no data), built by megatron-core's
    BlendedMegatronDatasetBuilder from Megatron's data flags."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.blended_megatron_dataset_config import BlendedMegatronDatasetConfig

    blend, per_split = blend_from_args(args)
    if blend is None and per_split is None:
        raise ZeppelinError("the document path needs data: --data-path PREFIX or a blend (--data-path 0.3 A 0.7 B, "
                            "--data-args-path, --train-data-path ...)")
    sizes: List[int] = []
    if blend is not None:
        weights, mean = document_weights(blend[0], blend[1], max_doc_tokens)
        blend = (blend[0], weights)
        sizes = [documents_needed(n, samples_per_step, tokens_per_step, mean) for n in num_samples]
    else:
        new = []
        for b, n in zip(per_split, num_samples):
            if b is None:
                new.append(None)
                sizes.append(0)
                continue
            weights, mean = document_weights(b[0], b[1], max_doc_tokens)
            new.append((b[0], weights))
            sizes.append(documents_needed(n, samples_per_step, tokens_per_step, mean))
        per_split = new
    config = BlendedMegatronDatasetConfig(
        random_seed=int(args.seed), sequence_length=int(max_doc_tokens), blend=blend, blend_per_split=per_split,
        split=args.split if blend is not None else None, path_to_cache=getattr(args, "data_cache_path", None),
        mid_level_dataset_surplus=float(getattr(args, "mid_level_dataset_surplus", 0.005) or 0.005),
        num_dataset_builder_threads=int(getattr(args, "num_dataset_builder_threads", 1) or 1))
    built = BlendedMegatronDatasetBuilder(WholeDocuments, sizes, lambda: True, config).build()
    if built[0] is None or len(built[0]) == 0:
        raise ZeppelinError("the training split holds no document of 2 or more tokens (fix --split or the data)")
    return [None if ds is None or len(ds) == 0 else DocumentStream(ds) for ds in built]


def split_documents(args) -> List[List[Tuple[str, int]]]:
    """Per split (train, valid, test): (prefix, documents of 2 or more tokens) of each dataset that
    split holds, as the builder splits them (nothing built): the checks before training."""
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix, parse_and_normalize_split)
    from megatron_zeppelin.integration.indexed_lengths import indexed_document_lengths

    blend, per_split = blend_from_args(args)
    if blend is None and per_split is None:
        return [[], [], []]
    if blend is None:
        return [[(p, int((indexed_document_lengths(p, f"--{s}-data-path") >= 2).sum())) for p in (b[0] if b else [])]
                for s, b in zip(SPLITS, per_split)]
    if args.split is None:
        raise ZeppelinError("a --data-path / --data-args-path blend needs --split (e.g. --split 98,2,0)")
    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(args.split))
    out: List[List[Tuple[str, int]]] = [[], [], []]
    for p in blend[0]:
        x = indexed_document_lengths(p, "--data-path")
        for k, bounds in enumerate(matrix):
            if bounds is not None:
                a, b = int(round(bounds[0] * x.size)), int(round(bounds[1] * x.size))
                out[k].append((p, int((x[a:b] >= 2).sum())))
    return out
