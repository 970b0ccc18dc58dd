"""``--tokenizer``: the lengths of a JSONL text dataset are what the named tokenizer counts, and the
output says which one counted, beside the whole dataset's statistics. The HuggingFace tokenizer is a
tiny BPE trained here on the test's own text (no download)."""

import json

import numpy as np
import pytest

from megatron_zeppelin.cli import main
from megatron_zeppelin.data.tokenizers import make_tokenizer

@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Token counts are cached under the test's own directory, never the user's."""
    monkeypatch.setenv("ZEPPELIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


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


def _bpe(tmp_path):
    tk = pytest.importorskip("tokenizers")
    tok = tk.Tokenizer(tk.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    tok.train_from_iterator(TEXTS, tk.trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"]))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path), tok


def _failing(tokenizer):
    """The same identity, but counting raises: a read that succeeds came from the cache."""
    import dataclasses

    def boom(*_):
        raise AssertionError("tokenized although cached")
    return dataclasses.replace(tokenizer, count=boom, count_batch=boom)


def test_token_counts_are_cached_per_file_and_tokenizer(tmp_path, cache, capsys):
    import os
    from megatron_zeppelin.data.workloads import read_lengths
    path, tok = _bpe(tmp_path)
    f = _jsonl(tmp_path)
    t = make_tokenizer(path)
    want = [len(tok.encode(x, add_special_tokens=False).ids) for x in TEXTS]
    assert read_lengths(str(f), tokenizer=t).tolist() == want
    assert len(list((cache / "token_counts").glob("*.npy"))) == 1
    assert "read from the cache" not in capsys.readouterr().err
    assert read_lengths(str(f), tokenizer=_failing(t)).tolist() == want  # second run: the cache
    assert "read from the cache" in capsys.readouterr().err  # and it says so
    assert make_tokenizer(path).identity == t.identity  # a digest of the file, stable across loads
    with pytest.raises(AssertionError, match="tokenized although cached"):  # another tokenizer: counted again
        read_lengths(str(f), tokenizer=_failing(make_tokenizer("byte")))
    st = os.stat(f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))  # the file changed: counted again
    with pytest.raises(AssertionError, match="tokenized although cached"):
        read_lengths(str(f), tokenizer=_failing(t))


def test_cache_directory_follows_xdg_and_can_be_off(tmp_path, monkeypatch):
    from megatron_zeppelin.data.workloads import read_lengths
    f = _jsonl(tmp_path)
    monkeypatch.delenv("ZEPPELIN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    read_lengths(str(f), tokenizer=make_tokenizer("byte"))
    assert len(list((tmp_path / "xdg" / "megatron_zeppelin" / "token_counts").glob("*.npy"))) == 1
    monkeypatch.setenv("ZEPPELIN_CACHE", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg2"))
    read_lengths(str(f), tokenizer=make_tokenizer("byte"))
    assert not (tmp_path / "xdg2").exists()


def test_streamed_batches_and_progress(tmp_path, monkeypatch, capsys):
    import functools
    from megatron_zeppelin.data import jsonl_lengths as jl
    from megatron_zeppelin.data.workloads import read_lengths
    path, tok = _bpe(tmp_path)
    f = tmp_path / "mixed.jsonl"
    rows = [{"text": t} for t in TEXTS] + [{"text": 17}] + [{"text": t} for t in TEXTS]  # an integer among texts
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(jl, "BATCH_CHARS", 100)  # many batches of a few texts
    monkeypatch.setattr(jl, "Progress", functools.partial(jl.Progress, after_s=0.0, every_s=0.0))
    got = read_lengths(str(f), tokenizer=make_tokenizer(path)).tolist()
    want = [len(tok.encode(t, add_special_tokens=False).ids) for t in TEXTS]
    assert got == want + [17] + want
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"counting tokens of {f} (HuggingFace tokenizers {path}): ") and "documents" in err[0]
    assert err[-1].startswith(f"counting tokens of {f} (HuggingFace tokenizers {path}): done")


def test_documented_jsonl_to_indexed_recipe(tmp_path):
    """docs/plan.md's recipe, run as written (python / zeppelin = this interpreter), read back with the
    indexed reader: the lengths and the token ids are the tokenizer's."""
    import os
    import re
    import subprocess
    import sys
    from megatron_zeppelin.data.workloads import read_lengths
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "plan.md")) as f:
        doc = f.read()
    block = re.search(r"<!-- recipe: jsonl-to-indexed[^>]*-->\n```bash\n(.*?)```", doc, re.S).group(1)
    path, tok = _bpe(tmp_path)
    _jsonl(tmp_path)  # the recipe's names: docs.jsonl, tokenizer.json
    script = re.sub(r"^python ", f"{sys.executable} ", block, flags=re.M)
    script = re.sub(r"^zeppelin ", f"{sys.executable} -m megatron_zeppelin.cli ", script, flags=re.M)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run(["bash", "-ec", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    want = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
    assert read_lengths(str(tmp_path / "data" / "docs")).tolist() == [len(x) for x in want]
    assert np.load(tmp_path / "data" / "docs_lengths.npy").tolist() == [len(x) for x in want]
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    ds = IndexedDataset(str(tmp_path / "data" / "docs"))
    assert [ds[i].tolist() for i in range(len(ds))] == want
    n = sum(len(x) for x in want)
    assert f"dataset: data/docs: {len(want)} documents, {n} tokens" in r.stdout
    assert f"dataset: data/docs_lengths.npy: {len(want)} documents, {n} tokens" in r.stdout
