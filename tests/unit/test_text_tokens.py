"""``--tokenizer``: the lengths of a JSONL text dataset are what the named tokenizer counts, and the
output says which one counted, beside the whole dataset's statistics. The HuggingFace tokenizer is a
tiny BPE trained here on the test's own text (no download)."""

import json

import numpy as np
import pytest

from megatron_zeppelin.cli import main
from megatron_zeppelin.data.tokenizers import make_tokenizer

TEXTS = ["def f(x):\n    return x + 1\n" * k for k in (1, 3, 7, 20, 40)] + ["hello wörld " * 50, "x = 1\n"]


def _jsonl(tmp_path):
    f = tmp_path / "docs.jsonl"
    f.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return f


def _plan(capsys, *argv):
    rc = main(["plan", "--model", "tiny", "--gpus-per-node", "2", "--global-batch-tokens", "0",
               "--context-length", "0", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_builtin_counters():
    assert make_tokenizer("byte").count("wörld") == 6
    assert make_tokenizer("bytes/4").count("wörld") == 2 and not make_tokenizer("bytes/4").exact
    assert make_tokenizer("NullTokenizer").count(" 5 17  3\n") == 3


@pytest.mark.parametrize("spec, count", [(None, lambda t: -(-len(t.encode()) // 4)), ("byte", lambda t: len(t.encode()))])
def test_jsonl_default_estimate_and_byte(capsys, tmp_path, spec, count):
    f, j = _jsonl(tmp_path), tmp_path / "p.json"
    rc, out, err = _plan(capsys, "--dataset", str(f), "--json", str(j), *(["--tokenizer", spec] if spec else []))
    assert rc == 0, err
    assert json.loads(j.read_text())["batch"]["lengths"] == [count(t) for t in TEXTS]
    name = make_tokenizer(spec).name
    assert f"(counted by --tokenizer {name} on field 'text')" in out
    x = np.array([count(t) for t in TEXTS])
    assert f"dataset: {f}: {len(TEXTS)} documents, {x.sum()} tokens" in out
    assert f"/ max {x.max()} /" in out and "p50" in out and "p99" in out


def test_huggingface_tokenizer_file(capsys, tmp_path):
    tk = pytest.importorskip("tokenizers")
    tok = tk.Tokenizer(tk.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    tok.train_from_iterator(TEXTS, tk.trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"]))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    f, j = _jsonl(tmp_path), tmp_path / "p.json"
    for argv in (["--tokenizer", str(path)], ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(path)]):
        rc, out, err = _plan(capsys, "--data-path", str(f), "--json", str(j), *argv)
        assert rc == 0, err
        want = [len(tok.encode(t, add_special_tokens=False).ids) for t in TEXTS]
        assert json.loads(j.read_text())["batch"]["lengths"] == want
        assert want != [-(-len(t.encode()) // 4) for t in TEXTS]  # not the estimate
        assert f"counted by --tokenizer HuggingFace tokenizers {path}" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    rc, out, err = _plan(capsys, "--dataset", str(f), "--tokenizer", str(bad))
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "not a tokenizers JSON file" in err


def test_lengths_file_says_its_own_lengths(capsys, tmp_path):
    f = tmp_path / "l.txt"
    f.write_text("300 200 100 40\n")
    rc, out, err = _plan(capsys, "--dataset", str(f))
    assert rc == 0, err
    assert "4 documents, 640 tokens (counted by the file's own lengths); length min 40 / p50 100" in out


def test_gpt2_bpe_from_vocab_and_merges(capsys, tmp_path):
    tk = pytest.importorskip("tokenizers")
    bpe = tk.ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXTS, vocab_size=300, min_frequency=1)
    vocab, merges = bpe.save_model(str(tmp_path))
    f, j = _jsonl(tmp_path), tmp_path / "p.json"
    rc, out, err = _plan(capsys, "--dataset", str(f), "--json", str(j), "--tokenizer-type", "GPT2BPETokenizer",
                         "--vocab-file", vocab, "--merge-file", merges)
    assert rc == 0, err
    assert json.loads(j.read_text())["batch"]["lengths"] == [len(bpe.encode(t).ids) for t in TEXTS]
    assert f"counted by --tokenizer GPT2BPETokenizer {vocab}" in out
