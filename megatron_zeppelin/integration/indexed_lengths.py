"""Document lengths of a Megatron indexed dataset (``PREFIX.idx`` + ``PREFIX.bin``).

Read with megatron-core's own IndexedDataset so the lengths are exactly the documents Megatron
trains on. A Megatron *document* may hold several *sequences* (sentence splitting); its length is
the sum of its sequences: ``document_indices`` marks where each document's sequences start.
data/workloads.py reads through it: it imports megatron only inside its function (only integration/
imports megatron) and nothing of the package but errors, so reading lengths loads no other layer.
"""

from __future__ import annotations

import os

import numpy as np

from megatron_zeppelin.errors import ZeppelinError


def indexed_document_lengths(prefix: str, flag: str = "--dataset") -> np.ndarray:
    """Token count of every document of the indexed dataset at ``prefix`` (int64, file order)."""
    if not (os.path.exists(prefix + ".idx") and os.path.exists(prefix + ".bin")):
        raise ZeppelinError(f"{prefix}.idx/.bin not found: set {flag} to a Megatron indexed dataset prefix")
    try:
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    except ImportError as e:  # pragma: no cover - megatron-core is a dependency
        raise ZeppelinError(f"reading {prefix}.idx needs megatron-core ({e})") from None
    try:
        ds = IndexedDataset(prefix, multimodal=False, mmap=True)
        seq = np.asarray(ds.sequence_lengths, dtype=np.int64)
        doc = np.asarray(ds.document_indices, dtype=np.int64)
    except (AssertionError, ValueError, OSError, IndexError) as e:
        raise ZeppelinError(f"malformed Megatron indexed dataset {prefix}.idx ({type(e).__name__}: {e}); "
                            f"fix {flag}") from None
    # cum[j] = tokens before sequence j; document d spans sequences doc[d]..doc[d+1]-1.
    cum = np.concatenate([[0], np.cumsum(seq)])
    return cum[doc[1:]] - cum[doc[:-1]]
