"""Token-count cache benchmark: the first and the second (cached) ``zeppelin plan`` on a JSONL of a
few MB with a real tokenizer.

The JSONL holds the Python standard library's ``.py`` files (one document per file, as many as fit
``--mb`` MB); the tokenizer is a byte-level BPE (``tokenizers``, ``--vocab`` tokens) trained here on
the first files and saved as tokenizer.json (nothing downloaded). Each ``zeppelin plan`` runs in a
fresh interpreter with ``ZEPPELIN_CACHE`` set to an empty directory under the output folder, so the
first run counts every text and the second reads the cached counts; both are timed from outside
(wall time of the whole command) together with the peak memory of the process.

    .venv/bin/python benchmarks/bench_tokenize_cache.py --out results/bench/tokenize_cache.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_jsonl(path: str, mb: float) -> int:
    import glob
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True))
    n, size = 0, 0
    with open(path, "w") as out:
        for f in files:
            if size >= mb * 1e6:
                break
            with open(f, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            if not text.strip():
                continue  # an empty __init__.py: no tokens, not a document
            line = json.dumps({"text": text}) + "\n"
            out.write(line)
            size += len(line.encode())
            n += 1
    return n


def make_tokenizer(jsonl: str, path: str, vocab: int) -> None:
    import tokenizers as tk
    with open(jsonl) as f:
        texts = [json.loads(line)["text"] for _, line in zip(range(200), f)]
    bpe = tk.ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab, min_frequency=2)
    bpe.save(path)


# ``zeppelin plan`` in a fresh interpreter that reports its own peak memory (KiB on Linux) last on stderr
RUN = ("import resource, sys; from megatron_zeppelin.cli import main; rc = main(sys.argv[1:]); "
       "print('peak_rss_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(rc)")


def timed_plan(argv, env) -> dict:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", RUN, "plan", *argv], env=env, capture_output=True, text=True,
                       timeout=1800)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"zeppelin plan failed:\n{r.stderr[-3000:]}")
    err = r.stderr.splitlines()
    peak = int(err[-1].split()[-1])
    done = [x for x in err if ": done, " in x]  # the progress line's own count of the tokenizing time
    return {"wall_s": round(wall, 3), "peak_rss_mb": round(peak / 1024, 1), "dataset_line": r.stdout.splitlines()[0],
            "progress_lines": len(err) - 1, "tokenizing_s": float(done[0].split(" in ")[-1][:-2]) if done else 0.0}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=5.0, help="size of the JSONL (default 5 MB)")
    p.add_argument("--vocab", type=int, default=8192, help="BPE vocabulary (default 8192)")
    p.add_argument("--work", default=os.path.join(ROOT, "results", "tokenize_cache"), help="scratch folder")
    p.add_argument("--out", default=os.path.join(ROOT, "results", "bench", "tokenize_cache.json"))
    a = p.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    jsonl, tok = os.path.join(a.work, "stdlib.jsonl"), os.path.join(a.work, "bpe.json")
    docs = make_jsonl(jsonl, a.mb)
    make_tokenizer(jsonl, tok, a.vocab)
    env = dict(os.environ, ZEPPELIN_CACHE=os.path.join(a.work, "cache"),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    argv = ["--dataset", jsonl, "--tokenizer", tok, "--model", "tiny", "--gpus-per-node", "2",
            "--global-batch-tokens", "64K", "--context-length", "16K"]
    first = timed_plan(argv, env)
    second = timed_plan(argv, env)
    off = timed_plan(argv, dict(env, ZEPPELIN_CACHE="off"))  # uncached again: the first run was not a fluke
    res = {"jsonl_bytes": os.path.getsize(jsonl), "documents": docs, "tokenizer": f"byte-level BPE, vocab {a.vocab}",
           "command": "zeppelin plan " + " ".join(argv), "first": first, "second_cached": second,
           "uncached_again": off, "speedup": round(first["wall_s"] / second["wall_s"], 2),
           "host": {"cpus": os.cpu_count(), "load_1min": os.getloadavg()[0]}}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: res[k] for k in ("jsonl_bytes", "documents", "speedup")}),
          f"first {first['wall_s']} s, second (cached) {second['wall_s']} s, uncached again {off['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
