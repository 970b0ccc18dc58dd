"""Remap benchmark: planning time of ``plan_remap`` at 1024 ranks, and how much the remap moves.

Planning time: 128 nodes x 8 GPUs (h200 profile, llama-7b). The attention layouts are the zeppelin
strategy's for one global batch of each preset (16K tokens per rank, 64K context), plus an
adversarial layout (every token on one rank of each node pair). Median and min of ``--repeats`` calls.

Traffic: arxiv, github and prolong64k (workloads.sample_batch, 64K context, 32K tokens per rank) at
4 nodes x 8 GPUs under the zeppelin strategy, seeds ``--seeds``: moved tokens / total tokens,
cross-node tokens / total, the predicted remap share of the iteration, and the transportation cost
against a baseline that gives the +1 tokens to the largest ranks (the previous greedy).

    .venv/bin/python benchmarks/bench_remap.py --out benchmarks/results/remap.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner import plan_batch
from megatron_zeppelin.planner.build.remap import link_costs, plan_remap, remap_cost, transfer_matrix
from megatron_zeppelin.planner.types import Segment
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.data.workloads import sample_batch

PRESETS = ("arxiv", "github", "prolong64k")


def _time(fn, repeats):
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts), 1e3 * min(ts)


def planning_time(prof, model, repeats, tokens_per_rank, strategy):
    topo = Topology(128, 8, prof.nics_per_node, prof.gpu_to_nic)
    w = topo.world_size
    rows = []
    for ds in PRESETS:
        lengths = sample_batch(ds, tokens_per_rank * w, seed=0, max_len=65536)
        t0 = time.perf_counter()
        plan = plan_batch(lengths, topo, prof, model, strategy=strategy)
        plan_s = time.perf_counter() - t0
        att, cm = plan.attention_layout, _cost(prof, model, topo)
        nseg = sum(len(r) for r in att)
        med, mn = _time(lambda: plan_remap(att, topo, cost=cm), repeats)
        rows.append({"layout": f"{strategy}:{ds}", "ranks": w, "docs": int(len(lengths)), "segments": nseg,
                     "moves": len(plan.remap), "median_ms": med, "min_ms": mn,
                     "whole_plan_batch_s": plan_s})
        print(f"plan_remap {w} ranks, {strategy} {ds:10s} ({nseg} segments): median {med:.2f} ms, "
              f"min {mn:.2f} ms")
    # Adversarial: even ranks of even nodes hold everything (many moves, half across nodes).
    att = tuple((Segment(r, 0, 2 * tokens_per_rank),) if (r % 2 == 0 and topo.node_of(r) % 2 == 0)
                else () for r in range(w))
    med, mn = _time(lambda: plan_remap(att, topo), repeats)
    _, moves = plan_remap(att, topo)
    rows.append({"layout": "adversarial", "ranks": w, "segments": sum(len(r) for r in att),
                 "moves": len(moves), "median_ms": med, "min_ms": mn})
    print(f"plan_remap {w} ranks, adversarial: median {med:.2f} ms, min {mn:.2f} ms ({len(moves)} moves)")
    return rows


def _largest_first_targets(counts):
    """The previous greedy's targets: the +1 tokens to the ranks holding the most."""
    total, w = sum(counts), len(counts)
    tgt = [total // w] * w
    for r in sorted(range(w), key=lambda r: (-counts[r], r))[:total % w]:
        tgt[r] += 1
    return tgt


def traffic(prof, model, seeds, tokens_per_rank, strategy):
    topo = Topology(4, 8, prof.nics_per_node, prof.gpu_to_nic)
    rows = []
    for ds in PRESETS:
        for seed in seeds:
            lengths = sample_batch(ds, tokens_per_rank * topo.world_size, seed=seed, max_len=65536)
            plan = plan_batch(lengths, topo, prof, model, strategy=strategy)
            total = int(sum(lengths))
            att_counts = [plan.tokens(r) for r in range(topo.world_size)]
            lin_counts = [plan.tokens(r, "linear") for r in range(topo.world_size)]
            moved = sum(m.tokens for m in plan.remap)
            cross = sum(m.tokens for m in plan.remap if not topo.same_node(m.src, m.dst))
            costs = link_costs(_cost(prof, model, topo))
            naive = transfer_matrix(att_counts, _largest_first_targets(att_counts), topo)
            naive_cost = sum(n * (costs[0] if topo.same_node(s, d) else costs[1]) for (s, d), n in naive.items())
            naive_cross = sum(n for (s, d), n in naive.items() if not topo.same_node(s, d))
            # What the layer moves when on: the token-balanced remap of this plan's attention layout
            # (the chosen Zeppelin variant may leave the remap off: then the plan itself moves nothing).
            _, bal = plan_remap(plan.attention_layout, topo, cost=_cost(prof, model, topo))
            bal_moved = sum(m.tokens for m in bal)
            bal_cross = sum(m.tokens for m in bal if not topo.same_node(m.src, m.dst))
            it = plan.predicted_iteration_s
            remap_share = max(c.remap_s for c in plan.cost) / it if it > 0 else 0.0
            row = {"dataset": ds, "seed": seed, "docs": int(len(lengths)), "total_tokens": total,
                   "moved_tokens": moved, "moved_fraction": moved / total,
                   "cross_node_tokens": cross, "cross_node_fraction": cross / total,
                   "attention_tokens_max_over_mean": max(att_counts) * topo.world_size / total,
                   "linear_tokens_max_minus_min": max(lin_counts) - min(lin_counts),
                   "moves": len(plan.remap), "max_remap_s_over_iteration": remap_share,
                   "cost": remap_cost(plan.remap, topo, costs), "largest_first_cost": naive_cost,
                   "largest_first_cross_node_tokens": naive_cross, "variant": dict(plan.meta).get("variant"),
                   "balanced_moved_fraction": bal_moved / total, "balanced_cross_node_fraction": bal_cross / total}
            rows.append(row)
            print(f"{ds:10s} seed {seed}: moved {row['moved_fraction']:.4f} of {total} tokens "
                  f"(cross-node {row['cross_node_fraction']:.4f}; largest-first would cross "
                  f"{naive_cross / total:.4f}), {len(plan.remap)} moves, remap/iteration "
                  f"{remap_share:.4f}, attention max/mean {row['attention_tokens_max_over_mean']:.2f}; "
                  f"variant {row['variant']}; token-balanced remap would move {bal_moved / total:.4f} "
                  f"(cross-node {bal_cross / total:.4f})")
    return rows


def _cost(prof, model, topo):
    from megatron_zeppelin.planner.cost.cost_model import CostModel
    return CostModel(model, prof, topo)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/remap.json", help="JSON output path")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--cluster", default="h200")
    ap.add_argument("--model", default="llama-7b")
    ap.add_argument("--strategy", default="zeppelin")
    ap.add_argument("--tokens-per-rank", type=int, default=32768, help="traffic cases (4 x 8 ranks)")
    ap.add_argument("--timing-tokens-per-rank", type=int, default=16384, help="1024-rank timing cases")
    args = ap.parse_args(argv)
    prof, model = load_profile(args.cluster), load_model(args.model)
    out = {"cluster": args.cluster, "model": args.model, "strategy": args.strategy,
           "planning_time_1024_ranks": planning_time(prof, model, args.repeats, args.timing_tokens_per_rank,
                                                     args.strategy),
           "traffic_4x8": traffic(prof, model, args.seeds, args.tokens_per_rank, args.strategy)}
    for ds in PRESETS:
        rs = [r for r in out["traffic_4x8"] if r["dataset"] == ds]
        out.setdefault("summary", {})[ds] = {
            "moved_fraction_mean": float(np.mean([r["moved_fraction"] for r in rs])),
            "cross_node_fraction_mean": float(np.mean([r["cross_node_fraction"] for r in rs])),
            "balanced_moved_fraction_mean": float(np.mean([r["balanced_moved_fraction"] for r in rs])),
            "balanced_cross_node_fraction_mean": float(np.mean([r["balanced_cross_node_fraction"] for r in rs]))}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
