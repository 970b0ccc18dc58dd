"""Megatron's data blends in the Megatron-LM entry's document path (integration/blend.py), without a
training loop: megatron-core's BlendedMegatronDatasetBuilder over whole documents, in the project's
.venv (torch.distributed not initialised). The training runs on a blend are in test_pretrain.py."""

import argparse
import json

import numpy as np
import pytest

import mlm_run as m
from megatron_zeppelin.data.blend import blend_order
from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.integration import megatron_lm as zl
from megatron_zeppelin.integration.blend import build_document_splits, document_weights
from megatron_zeppelin.integration.data import BatchSampler, DocumentDataset

pytestmark = pytest.mark.megatron_lm
TOKENS, CAP = 256, 256  # tokens of one global micro-batch, longest trained document


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    d = tmp_path_factory.mktemp("blend")
    return m.build_dataset(str(d / "a"), n_docs=160, seed=0), m.build_dataset(str(d / "b"), n_docs=80, seed=1)


def ns(**kw):
    d = dict(seed=1234, split="90,10,0", data_path=None, data_args_path=None, train_data_path=None,
             valid_data_path=None, test_data_path=None, per_split_data_args_path=None, data_cache_path=None)
    d.update(kw)
    return argparse.Namespace(**d)


def streams(args, samples=(32, 8, 0)):
    return build_document_splits(args, list(samples), 4, TOKENS, CAP)


def batches(stream, n, start=0):
    b = zl.DocumentBatches(stream, TOKENS, CAP, start)
    return [b.sampler.batch(s) for s in range(start, start + n)]


def test_one_prefix_keeps_the_batches_it_trained_before(two):
    # before blends: BatchSampler over the split's documents, seed --seed (train) / --seed + 1 (valid)
    a = two[0]
    tr, va, _ = streams(ns(data_path=[a]))
    lengths = DocumentDataset(a).lengths
    for stream, (lo, hi), seed in ((tr, (0, 144), 1234), (va, (144, 160), 1235)):
        old = BatchSampler([L if lo <= i < hi else 0 for i, L in enumerate(lengths)], TOKENS, CAP, seed=seed)
        assert [[(k[1], n) for k, n in b] for b in batches(stream, 30)] == [old.batch(s) for s in range(30)]


def test_blend_takes_megatron_order_and_token_shares(two):
    a, b = two
    tr, va, _ = streams(ns(data_path=["0.3", a, "0.7", b]))
    # the dataset of each document is megatron-core's BlendedDataset's, whose order is
    # build_blending_indices on the document weights (data/blend.py restates it for zeppelin plan)
    weights, _ = document_weights([a, b], [0.3, 0.7], CAP)
    assert tr.index.tolist() == blend_order(weights, tr.index.size).tolist()
    tok = np.zeros(2)
    for batch in batches(tr, 1000):
        for (which, _), n in batch:
            tok[which] += n
    assert abs(tok[0] / tok.sum() - 0.3) < 0.02, tok / tok.sum()  # token shares, not document shares
    # past the blended index (sized for the run's samples) the order goes on with new documents
    assert tr.index.size < sum(len(x) for x in batches(tr, 1000))
    got = {k for x in batches(va, 50) for k, _ in x}
    assert {w for w, _ in got} == {0, 1}
    assert all(d >= 144 for w, d in got if w == 0) and all(d >= 72 for w, d in got if w == 1)  # validation docs


def test_resume_starts_at_the_batch_after_the_last(two):
    tr = streams(ns(data_path=["0.3", two[0], "0.7", two[1]]))[0]
    assert batches(tr, 3, start=7) == batches(tr, 10)[7:]


def test_data_args_path_and_per_split_paths(two, tmp_path):
    a, b = two
    f = tmp_path / "blend.txt"
    f.write_text(f"0.3 {a}\n0.7 {b}\n")
    via_file = streams(ns(data_args_path=str(f)))
    direct = streams(ns(data_path=["0.3", a, "0.7", b]))
    assert batches(via_file[0], 5) == batches(direct[0], 5)
    per = ns(split=None, train_data_path=["0.5", a, "0.5", b], valid_data_path=[b])
    tr, va, te = streams(per)
    assert te is None and {w for x in batches(tr, 20) for (w, _), _ in x} == {0, 1}
    assert va.parts[0].dataset_path == b and va.index is None  # one prefix: no BlendedDataset
    j = tmp_path / "split.json"
    j.write_text(json.dumps({"train": f"0.5 {a} 0.5 {b}", "valid": [b], "test": []}))
    from_json = streams(ns(split=None, per_split_data_args_path=str(j)))
    assert batches(from_json[0], 5) == batches(tr, 5) and batches(from_json[1], 5) == batches(va, 5)


def _validate(**kw):
    p = zl.extra_args_provider(argparse.ArgumentParser())
    args = p.parse_args(["--zeppelin-balance", "--zeppelin-gpus-per-node", "2"])
    args.__dict__.update(calculate_per_token_loss=True, dataloader_type="external", position_embedding_type="rope",
                         spec=None, tensor_model_parallel_size=1, eval_iters=0, eval_interval=10)
    args.__dict__.update(ns(**kw).__dict__)
    zl.validate(args)


def test_blend_errors_name_the_flag(two, tmp_path):
    a, b = two
    _validate(data_path=["0.3", a, "0.7", b], eval_iters=5)
    _validate(split=None, train_data_path=[a], valid_data_path=[b], eval_iters=5)
    with pytest.raises(ZeppelinError, match="--eval-iters 5 needs validation documents"):
        _validate(split=None, train_data_path=[a], eval_iters=5)
    tiny = m.build_dataset(str(tmp_path / "tiny"), n_docs=5, seed=2)  # 90,10: round(0.9 x 5) = 4 of 5 train
    with pytest.raises(ZeppelinError, match="--split 99,1,0 leaves no validation document in .*tiny"):
        _validate(data_path=[a, tiny], split="99,1,0")
    with pytest.raises(ZeppelinError, match="--mock-data"):
        _validate(data_path=[a], mock_data=True)
    with pytest.raises(ZeppelinError, match="give --data-path PREFIX, or a blend"):
        _validate()
    with pytest.raises(ZeppelinError, match="not both"):
        _validate(data_path=[a], train_data_path=[b])
