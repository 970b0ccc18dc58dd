#!/bin/bash
# The five configurations of the longest regeneration times (results/report/regenerate.log), each run
# by an older tree (OLD, a `git archive <commit> megatron_zeppelin | tar -x -C OLD`) and by this one
# side by side (one core each), their records compared (timing fields aside) and their times written.
#   OLD=/path/to/old bash results/s62/scripts/heavy_configs.sh
set -e
cd "$(dirname "$0")/../../.."
OUT=results/s62/heavy
mkdir -p "$OUT"
for key in accumulation/a800/llama-7b-tp1/prolong64k accumulation/a800/llama-7b-tp1/arxiv \
           accumulation_4m/h200/llama3-8b-tp1/prolong64k pipeline/h200/llama3-70b-tp8/prolong64k/ctx64K/16n/gbs4M \
           accumulation_70b/h200/llama3-70b-tp8/prolong64k; do
  name=$(echo "$key" | tr '/' '_')
  PYTHONPATH="$OLD" .venv/bin/python results/s62/scripts/one_config_timed.py "$key" "$OUT/old_$name.json" &
  PYTHONPATH=. .venv/bin/python results/s62/scripts/one_config_timed.py "$key" "$OUT/new_$name.json"
  wait
done
.venv/bin/python results/s62/scripts/compare_heavy.py "$OUT"
