"""Workloads: presets, sampling by token budget, cutting at the context length, length files."""

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.data.workloads import (PRESETS, WorkloadError, cut_to_context, fill_budget,
                                         load_distribution, read_lengths, sample_batch)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_batch_is_exact_reproducible_and_cut(name):
    b = sample_batch(name, 300_000, seed=3, max_len=8192)
    assert b.dtype == np.int64 and b.ndim == 1
    assert int(b.sum()) == 300_000
    assert b.min() >= 1 and b.max() <= 8192
    assert np.array_equal(b, sample_batch(name, 300_000, seed=3, max_len=8192))
    assert not np.array_equal(b, sample_batch(name, 300_000, seed=4, max_len=8192))


@pytest.mark.parametrize("name", PRESETS)
def test_preset_mean_matches_its_sourced_parameters(name):
    # Drawn means converge to the mixture mean computed from the YAML (clipped lognormals).
    d = load_distribution(name)
    x = d.draw(np.random.default_rng(0), 400_000)
    assert abs(x.mean() / d.mean_tokens() - 1) < 0.03


def test_prolong_token_shares_follow_the_mix():
    # Section 6.2: 60% of tokens from documents >= 64K, while almost every document is short.
    x = load_distribution("prolong64k").draw(np.random.default_rng(1), 400_000)
    long = x >= 65536
    assert abs(x[long].sum() / x.sum() - 0.60) < 0.02
    assert long.mean() < 0.05


def test_presets_are_long_tailed_in_the_right_order():
    means = {n: load_distribution(n).mean_tokens() for n in PRESETS}
    assert means["arxiv"] > means["openwebmath"] > means["github"] > means["fineweb"] > 0
    assert means["stackexchange"] < 1000


@given(st.lists(st.integers(1, 500), min_size=1, max_size=40), st.integers(1, 64))
@settings(max_examples=60, deadline=None)
def test_cut_keeps_every_token_in_order(lengths, m):
    x = np.array(lengths)
    y = cut_to_context(x, m)
    assert y.sum() == x.sum() and y.max() <= m and y.min() >= 1
    assert len(y) == sum(-(-L // m) for L in lengths)


@given(st.lists(st.integers(1, 100), min_size=1, max_size=30), st.data())
@settings(max_examples=60, deadline=None)
def test_fill_budget_is_a_prefix_with_the_last_cut(lengths, data):
    x = np.array(lengths)
    t = data.draw(st.integers(1, int(x.sum())))
    y = fill_budget(x, t)
    assert y.sum() == t and y.min() >= 1
    assert np.array_equal(y[:-1], x[:len(y) - 1]) and y[-1] <= x[len(y) - 1]


def test_length_files(tmp_path):
    npy = tmp_path / "a.npy"
    np.save(npy, np.array([5, 7, 100], dtype=np.int32))
    assert read_lengths(str(npy)).tolist() == [5, 7, 100]
    txt = tmp_path / "a.txt"
    txt.write_text("5 7\n100\n\n")
    assert read_lengths(str(txt)).tolist() == [5, 7, 100]
    jl = tmp_path / "a.jsonl"
    jl.write_text('{"length": 5, "n": 2}\n{"length": 7, "n": 3}\n')
    assert read_lengths(str(jl)).tolist() == [5, 7]
    assert read_lengths(f"{jl}:n").tolist() == [2, 3]
    tj = tmp_path / "t.jsonl"
    tj.write_text(json.dumps({"text": "x" * 9}) + "\n" + json.dumps({"text": "é"}) + "\n")
    assert read_lengths(str(tj)).tolist() == [3, 1]  # ceil(bytes / 4): 9 -> 3, 2 bytes -> 1


def test_file_batches(tmp_path):
    f = tmp_path / "l.txt"
    f.write_text("\n".join(str(x) for x in [10, 300, 20, 40]))
    assert sample_batch(str(f), 0, seed=0).tolist() == [10, 300, 20, 40]  # whole file, file order
    assert sample_batch(str(f), 0, seed=0, max_len=128).tolist() == [10, 128, 128, 44, 20, 40]
    b = sample_batch(str(f), 1000, seed=1, max_len=128)  # more than one pass over the file
    assert b.sum() == 1000 and b.max() <= 128
    assert np.array_equal(b, sample_batch(str(f), 1000, seed=1, max_len=128))


def test_megatron_indexed_dataset(tmp_path):
    torch = pytest.importorskip("torch")
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    prefix = str(tmp_path / "corpus_text_document")
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    b.add_item(torch.arange(5, dtype=torch.int32))
    b.end_document()
    b.add_item(torch.arange(3, dtype=torch.int32))  # one document of two sequences: 3 + 4 tokens
    b.add_item(torch.arange(4, dtype=torch.int32))
    b.end_document()
    b.add_item(torch.arange(11, dtype=torch.int32))
    b.end_document()
    b.finalize(prefix + ".idx")
    assert read_lengths(prefix).tolist() == [5, 7, 11]
    assert read_lengths(prefix + ".idx").tolist() == [5, 7, 11]
    assert sample_batch(prefix, 0, seed=0).tolist() == [5, 7, 11]


@pytest.mark.parametrize("content, needle", [
    ("5\n-3\n", "length -3"),
    ("5\n0\n", "length 0"),
    ("", "no document lengths"),
    ("5\nabc\n", "line 2"),
])
def test_bad_length_files(tmp_path, content, needle):
    f = tmp_path / "bad.txt"
    f.write_text(content)
    with pytest.raises(WorkloadError, match=needle) as e:
        read_lengths(str(f))
    assert "--dataset" in str(e.value)


def test_bad_inputs_name_the_flag(tmp_path):
    with pytest.raises(WorkloadError, match="unknown dataset preset 'nope'.*--dataset"):
        sample_batch("nope", 1000, 0)
    with pytest.raises(WorkloadError, match="dataset file '.*missing.npy' not found.*--dataset"):
        sample_batch(str(tmp_path / "missing.npy"), 1000, 0)
    jl = tmp_path / "x.jsonl"
    jl.write_text('{"length": 5}\nnot json\n')
    with pytest.raises(WorkloadError, match="line 2.*--dataset"):
        read_lengths(str(jl))
    jl.write_text('{"tokens": 5}\n')
    with pytest.raises(WorkloadError, match="no field 'text'"):
        read_lengths(str(jl))
    two_d = tmp_path / "m.npy"
    np.save(two_d, np.ones((2, 2), dtype=np.int64))
    with pytest.raises(WorkloadError, match="1-D"):
        read_lengths(str(two_d))
    y = tmp_path / "d.yaml"
    y.write_text("name: x\ncomponents: [{token_share: 1, mean_tokens: big, sigma: 1}]\n")
    with pytest.raises(WorkloadError, match="component 0"):
        sample_batch(str(y), 1000, 0)
    y.write_text("name: [unclosed\n")
    with pytest.raises(WorkloadError, match="malformed dataset distribution") as e:
        sample_batch(str(y), 1000, 0)
    assert "\n" not in str(e.value)
    with pytest.raises(WorkloadError, match="--global-batch-tokens"):
        sample_batch("arxiv", 0, 0)
    with pytest.raises(ZeppelinError, match="Megatron indexed dataset"):
        (tmp_path / "broken.idx").write_bytes(b"garbage")
        (tmp_path / "broken.bin").write_bytes(b"")
        read_lengths(str(tmp_path / "broken"))


def test_user_distribution_yaml(tmp_path):
    y = tmp_path / "mine.yaml"
    y.write_text("name: mine\ncomponents:\n  - {token_share: 1, mean_tokens: 300, sigma: 0, min_tokens: 1}\n")
    b = sample_batch(str(y), 3000, seed=0)
    assert b.tolist() == [300] * 10
    with pytest.raises(WorkloadError, match="--global-batch-tokens"):
        sample_batch(str(y), 0, seed=0)


def _two_files(tmp_path):
    a, b = tmp_path / "short.npy", tmp_path / "long.npy"
    np.save(a, np.arange(50, 150))  # mean 99.5 tokens
    np.save(b, np.arange(900, 1100, 4))  # mean 998
    return str(a), str(b)


def test_blend_draws_the_weights_token_shares(tmp_path):
    a, b = _two_files(tmp_path)
    batch = sample_batch(f"0.3 {a} 0.7 {b}", 1 << 20, seed=0)
    assert batch.sum() == 1 << 20
    short = batch[batch < 150].sum() / batch.sum()  # only the last document is cut
    assert abs(short - 0.3) < 0.01, short
    assert np.array_equal(batch, sample_batch(f"0.3 {a} 0.7 {b}", 1 << 20, seed=0))
    assert not np.array_equal(batch, sample_batch(f"0.3 {a} 0.7 {b}", 1 << 20, seed=1))
    # Megatron's weights are relative (30 70 = 0.3 0.7); without weights each file's share is its tokens
    assert np.array_equal(batch, sample_batch(f"30 {a} 70 {b}", 1 << 20, seed=0))
    x = sample_batch(f"{a} {b}", 1 << 20, seed=0)
    tokens_a, tokens_b = np.arange(50, 150).sum(), np.arange(900, 1100, 4).sum()
    assert abs(x[x < 150].sum() / x.sum() - tokens_a / (tokens_a + tokens_b)) < 0.01


def test_blend_order_is_megatrons():
    from megatron_zeppelin.data.blend import blend_order
    helpers = pytest.importorskip("megatron.core.datasets.helpers_cpp")
    w = np.array([0.2, 0.5, 0.3])
    idx, sample = np.zeros(1000, dtype=np.int16), np.zeros(1000, dtype=np.int64)
    helpers.build_blending_indices(idx, sample, w, 3, 1000, False)
    assert blend_order(w, 1000).tolist() == idx.tolist()


def test_blend_on_the_command_line(tmp_path, capsys):
    from megatron_zeppelin.cli import main
    a, b = _two_files(tmp_path)
    base = ["plan", "--model", "tiny", "--gpus-per-node", "2", "--global-batch-tokens", "64K"]
    j1, j2 = tmp_path / "1.json", tmp_path / "2.json"
    assert main(base + ["--data-path", "0.3", a, "0.7", b, "--json", str(j1)]) == 0
    out = capsys.readouterr().out
    assert f"dataset: blend of 2 datasets, token shares from the blend's weights" in out
    assert f"{a} (token share 0.300): 100 documents" in out and f"{b} (token share 0.700): 50 documents" in out
    args = tmp_path / "blend.txt"
    args.write_text(f"0.3 {a}\n0.7 {b}\n")
    assert main(base + ["--data-args-path", str(args), "--json", str(j2)]) == 0
    capsys.readouterr()
    load = lambda f: json.loads(f.read_text())["batch"]["lengths"]  # noqa: E731
    assert load(j1) == load(j2) == sample_batch(f"0.3 {a} 0.7 {b}", 1 << 16, 0, max_len=1 << 16).tolist()
    assert json.loads(j1.read_text())["dataset"]["kind"] == "blend"
    assert main(["simulate", "--model", "tiny", "--global-batch-tokens", "16K",
                 "--data-path", "0.3", a, "0.7", b]) == 0
    assert "blend of 2 datasets" in capsys.readouterr().out
    for argv, needle in ((["--data-path", "0.3", a, "-1", b], "every weight of a blend must be a positive"),
                         (["--data-path", "0.3", a, "0.7", "arxiv"], "blend entry 'arxiv' is not a file"),
                         (["--data-path", "0.3", a, "0.7", a], "names each dataset once")):
        assert main(base + argv) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(SystemExit) as e:  # an argparse error, read while the flags are parsed
        main(base + ["--data-args-path", str(tmp_path / "none.txt")])
    assert e.value.code == 2 and "--data-args-path" in capsys.readouterr().err
