"""A tiny Megatron indexed dataset of byte-token documents: the data of the CPU SLURM matrix.

megatron_zeppelin/presets/runs/slurm_cpu.yaml trains with ``NullTokenizer --vocab-size 256``, whose
end-of-document id is 255; its stock ``dp`` job resets the attention mask and position ids there.
So every document here is random byte tokens below 255 ending in one 255, with long-tailed
lengths (lognormal, 8..600 tokens) so that a batch mixes short and long documents, as Zeppelin's
plans need. Written with megatron-core's own IndexedDatasetBuilder (``PREFIX.bin`` + ``PREFIX.idx``),
the .bin renamed into place before the .idx so a reader never sees half a pair.
"""

from __future__ import annotations

import os

import numpy as np

EOD = 255  # NullTokenizer(vocab_size=256)'s end-of-document id


def write_byte_documents(prefix: str, n_docs: int = 400, seed: int = 0) -> str:
    """Write ``n_docs`` documents (seeded) at ``prefix``; returns the prefix."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(mean=4.0, sigma=1.0, size=n_docs), 8, 600).astype(int)
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    tmp = f"{prefix}.tmp{os.getpid()}"
    builder = IndexedDatasetBuilder(tmp + ".bin", dtype=np.uint8)
    for n in lengths:
        doc = rng.integers(0, EOD, size=int(n), dtype=np.uint8)
        doc[-1] = EOD
        builder.add_document(torch.from_numpy(doc), [int(n)])
    builder.finalize(tmp + ".idx")
    os.replace(tmp + ".bin", prefix + ".bin")
    os.replace(tmp + ".idx", prefix + ".idx")
    return prefix
