"""Make the user-journey dataset of results/journey/transcript.md: real documents of mixed length
(Python sources and docs from this venv's site-packages, manual pages under /usr/share/man
decompressed, license texts), a BPE tokenizer trained on them, as a user with their own data would.

    .venv/bin/python benchmarks/make_journey_data.py --out /work/wt/journey-data

writes OUT/docs.jsonl (the main set: mixed code and prose), OUT/extra.jsonl (another part of the
same sources, disjoint from docs.jsonl: the second dataset of the blend) and OUT/tokenizer.json (a
byte-level BPE of --vocab-size ids, 0 .. vocab-1, so that an end-of-document id of --vocab-size fits
Megatron's NullTokenizer of vocab --vocab-size + 1 in the CPU SLURM job). The selection is
deterministic (sorted paths, every k-th file), so a rerun on the same machine gives the same files.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import site
import sys


def _files(root: str, suffixes: tuple) -> list:
    out = []
    for d, _, names in os.walk(root, followlinks=True):
        for n in names:
            if n.endswith(suffixes) or (suffixes == ("LICENSE",) and n.startswith("LICENSE")):
                out.append(os.path.join(d, n))
    return sorted(out)


def _read(path: str) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _every(paths: list, n: int, offset: int) -> list:
    """n paths spread over the sorted list (every k-th, starting at offset), so both sets mix packages."""
    if not paths:
        return []
    k = max(1, len(paths) // max(1, n))
    return paths[offset::k][:n]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for docs.jsonl, extra.jsonl, tokenizer.json")
    p.add_argument("--vocab-size", type=int, default=4095, help="BPE ids 0 .. N-1 (default 4095)")
    p.add_argument("--code", type=int, default=2000, help="Python sources per set (default 2000)")
    p.add_argument("--docs", type=int, default=300, help="package docs/licenses per set (default 300)")
    p.add_argument("--man", type=int, default=1200, help="manual pages per set (default 1200)")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    sp = next(s for s in site.getsitepackages() if os.path.isdir(s))
    code = _files(sp, (".py",))
    docs = _files(sp, (".md", ".rst", ".txt")) + _files(sp, ("LICENSE",))
    man = _files("/usr/share/man", (".gz",))
    licenses = _files("/usr/share/common-licenses", ("",))
    # the longest sources (torch's generated test tables, MBs each): a long tail as real corpora have
    largest = sorted(code, key=lambda q: -os.path.getsize(q))[:4]
    sets = {}
    for name, offset in (("docs.jsonl", 0), ("extra.jsonl", 1)):
        chosen = _every(code, a.code, offset) + _every(docs, a.docs, offset) + _every(man, a.man, offset)
        chosen = [q for q in chosen if q not in largest] + largest[offset::2]
        if offset == 0:
            chosen += licenses  # the license texts: prose of a few KB to 35 KB
        sets[name] = chosen
    for name, paths in sets.items():
        sizes = []
        with open(os.path.join(a.out, name), "w") as f:
            for path in paths:
                text = _read(path)
                if not text:
                    continue
                f.write(json.dumps({"text": text, "source": path}) + "\n")
                sizes.append(len(text.encode("utf-8")))
        sizes.sort()
        print(f"{name}: {len(sizes)} documents, {sum(sizes) / 1e6:.1f} MB, "
              f"{sizes[0]} bytes to {sizes[-1] / 1e6:.2f} MB (median {sizes[len(sizes) // 2]} bytes)")
    _train_tokenizer(os.path.join(a.out, "docs.jsonl"), os.path.join(a.out, "tokenizer.json"), a.vocab_size)
    return 0


def _train_tokenizer(jsonl: str, out: str, vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def texts():
        with open(jsonl) as f:
            for line in f:
                yield json.loads(line)["text"][:200_000]  # a long file's head is enough to learn merges

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts(), trainer)
    tok.save(out)
    print(f"tokenizer.json: byte-level BPE, {tok.get_vocab_size()} ids")


if __name__ == "__main__":
    sys.exit(main())
