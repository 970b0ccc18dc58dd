"""Token ids beyond the model's vocabulary: one line naming --data-path before anything runs (not an
IndexError from the embedding on some rank, some step)."""

import numpy as np
import pytest

from megatron_zeppelin.cli import main


def _dataset(tmp_path, top):
    torch = pytest.importorskip("torch")
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    prefix = str(tmp_path / "ids_text_document")
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for n in (40, 70, 30):
        b.add_item(torch.arange(n, dtype=torch.int64) % 200)
        b.end_document()
    b.add_item(torch.tensor([1, 2, top, 3], dtype=torch.int64))
    b.end_document()
    b.finalize(prefix + ".idx")
    return prefix


def test_ids_beyond_vocab_are_one_line(tmp_path, capsys):
    from megatron_zeppelin.spec.model import load_model
    vocab = load_model("tiny").vocab
    prefix = _dataset(tmp_path, vocab + 7)
    save = tmp_path / "ckpt"
    rc = main(["train", "--model", "tiny", "--data-path", prefix, "--train-iters", "1", "--save", str(save)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("zeppelin train: error: --data-path") and f"token id {vocab + 7}" in err[0]
    assert f"tiny's vocabulary of {vocab}" in err[0] and "at token 142" in err[0]
    assert not save.exists()


def test_ids_within_vocab_pass(tmp_path):
    from megatron_zeppelin.integration.data import DocumentDataset
    DocumentDataset(_dataset(tmp_path, 255)).check_vocab(256)
    DocumentDataset(_dataset(tmp_path, 255) + ".bin").check_vocab(256)
