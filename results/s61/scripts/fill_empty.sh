#!/usr/bin/env bash
# rounds (least fill) against rounds_full (filled to the capacity) on stop 54's seven memory-bound
# accumulation configurations and the h200 70B, now that steps beyond the rounds run empty.
# Run from the repository root: bash results/s61/scripts/fill_empty.sh
set -euo pipefail
run() {  # study label out
  PYTHONPATH=. .venv/bin/python benchmarks/bench_accumulation_assign.py --only rounds rounds_full \
    --study "results/bench/$1.json" --label "$2" --out "results/s61/fill_$3.json" | grep -v '^wrote'
}
run accumulation "a800 llama-13b tp2 arxiv 64K 4n mem gbs 1M x14" a800_llama-13b_arxiv
run accumulation "a800 llama-7b github 64K 4n mem gbs 1M x9" a800_llama-7b_github
run accumulation "a800 llama-7b prolong64k 64K 4n mem gbs 1M x9" a800_llama-7b_prolong64k
run accumulation "a800 llama3-8b prolong64k 64K 4n mem gbs 1M x15" a800_llama3-8b_prolong64k
run accumulation "h200 llama-13b tp2 github 64K 4n mem gbs 1M x5" h200_llama-13b_github
run accumulation "h200 llama-7b arxiv 64K 4n mem gbs 1M x3" h200_llama-7b_arxiv
run accumulation "h200 llama3-8b github 64K 4n mem gbs 1M x4" h200_llama3-8b_github
run accumulation_70b "h200 llama3-70b tp8 github 64K 4n mem gbs 1M x28" h200_llama3-70b_github
