"""How ``zeppelin advise``'s recommendation changes once it searches the per-rank share (issue 56
item 1): the preset mixes at 32K, 64K and 128K contexts, 1M tokens per global batch.

For each (dataset, context) one advise search (the simulator, as ``zeppelin advise`` runs it) gives
every candidate; the pick is made twice from them with the same rule (recommend.pick): *before*,
among the candidates whose --seq-length is the context (what advise weighed before it searched
shares: there Zeppelin and packed DP need DP x micro-batch to divide the G / context sequences),
and *after*, among all. Both picks, their predicted iteration and memory, and the best Zeppelin
candidate are written as JSON and printed as a markdown table.

    .venv/bin/python benchmarks/bench_advise_contexts.py --out results/bench/advise_contexts.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

from megatron_zeppelin.advise.recommend import advise, pick
from megatron_zeppelin.data.workloads import sample_batch
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.token_counts import parse_tokens

DATASETS = ("arxiv", "github", "prolong64k")
CONTEXTS = ("32K", "64K", "128K")


def describe(c) -> dict:
    if c is None:
        return {"pick": "nothing fits"}
    how = (f"CP {c.cp}" if c.cp > 1 else f"share {c.share // 1024}K" if c.zeppelin_entry else "no CP")
    name = {"static_cp": "Megatron CP", "zeppelin": "Zeppelin", "packed_dp": "packed DP"}.get(c.strategy, c.strategy)
    return {"pick": f"TP {c.tp}, {name} ({how}), DP {c.dp}, mbs {c.mbs} x {c.ga}, ZeRO-{c.zero_stage}, "
                    f"{c.recompute.granularity} recompute",
            "iteration_s": round(c.iteration_s, 3), "memory_GiB": round(c.memory.total / 2**30, 1),
            "strategy": c.strategy, "tp": c.tp, "cp": c.cp, "share": c.share, "mbs": c.mbs, "ga": c.ga,
            "zero_stage": c.zero_stage, "recompute": c.recompute.granularity}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-7b")
    ap.add_argument("--cluster", default="a800")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--global-batch-tokens", default="1M")
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS))
    ap.add_argument("--contexts", nargs="+", default=list(CONTEXTS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-sim", dest="sim", action="store_false")
    ap.add_argument("--out", default="results/bench/advise_contexts.json")
    a = ap.parse_args()
    model, profile = load_model(a.model), load_profile(a.cluster)
    mem = float(profile.memory_GB) * 1e9
    tokens = parse_tokens(a.global_batch_tokens)
    rows = []
    for ds in a.datasets:
        for ctx in a.contexts:
            context = parse_tokens(ctx)
            t0 = time.perf_counter()
            lengths = sample_batch(ds, tokens, a.seed, context)
            after = advise(lengths, model, profile, a.nodes, mem, seq_length=context, use_sim=a.sim)
            before = pick([c for c in after.candidates if c.share == context], mem)
            fit_z = [c for c in after.candidates if c.strategy == "zeppelin" and c.fits]
            row = {"dataset": ds, "context": context, "documents": len(lengths),
                   "before": describe(before.best), "after": describe(after.best),
                   "best_zeppelin": describe(min(fit_z, key=lambda c: c.iteration_s) if fit_z else None),
                   "search_s": round(time.perf_counter() - t0, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    doc = {"command": "benchmarks/bench_advise_contexts.py", "model": a.model, "cluster": a.cluster,
           "nodes": a.nodes, "global_batch_tokens": tokens, "seed": a.seed, "simulator": a.sim, "rows": rows}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"\n{a.model} on {a.nodes} x {profile.gpus_per_node} {profile.name}, {tokens} tokens per global batch\n")
    print("| dataset | context | before: pick | s | GiB | after: pick | s | GiB | speedup |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        b, f = r["before"], r["after"]
        sp = f"{b['iteration_s'] / f['iteration_s']:.2f}x" if "iteration_s" in b and "iteration_s" in f else "-"
        print(f"| {r['dataset']} | {r['context'] // 1024}K | {b['pick']} | {b.get('iteration_s', '-')} | "
              f"{b.get('memory_GiB', '-')} | {f['pick']} | {f.get('iteration_s', '-')} | {f.get('memory_GiB', '-')} | {sp} |")


if __name__ == "__main__":
    main()
