"""Engine compute time per rank under different strategies' plans of the same batch (CPU, gloo).

World 4 as 2 nodes x 2 GPUs by default. For each strategy: plan the batch, run the engine forward +
backward ``--repeat`` times on every rank (after one warm-up), and record each rank's compute seconds
(the engine's counters, inter + intra + local queues: thread CPU seconds, which stay honest when
ranks outnumber cores, and wall seconds) and wall seconds per iteration. Writes JSON
with max / mean per strategy (max / mean is the imbalance the planner is meant to remove).

    .venv/bin/python benchmarks/bench_engine.py --out benchmarks/results/engine.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from megatron_zeppelin.attention.engine import AttentionEngine  # noqa: E402
from megatron_zeppelin.spec.config import ZeppelinConfig  # noqa: E402
from megatron_zeppelin.distributed.counters import CommCounters  # noqa: E402
from megatron_zeppelin.distributed.launch import run_distributed  # noqa: E402
from megatron_zeppelin.spec.model import ModelSpec  # noqa: E402
from megatron_zeppelin.planner import plan_batch  # noqa: E402
from megatron_zeppelin.planner.testing import TOY_PROFILE  # noqa: E402
from megatron_zeppelin.spec.topology import Topology  # noqa: E402


def make_batch(seed: int, tokens: int, longest: int):
    """One long document plus a long tail of short ones (variable-length data)."""
    rng = random.Random(seed)
    out = [longest]
    while sum(out) < tokens:
        out.append(max(16, min(longest, int(rng.lognormvariate(5.0, 1.0)))))
    return out


def _rank(rank, world, plans, heads, kv_heads, d, repeat):
    res = {}
    for name, plan in plans:
        t = plan.tokens(rank)
        g = torch.Generator().manual_seed(rank)
        q = torch.randn(t, heads, d, generator=g, requires_grad=True)
        k = torch.randn(t, kv_heads, d, generator=g, requires_grad=True)
        v = torch.randn(t, kv_heads, d, generator=g, requires_grad=True)
        c = CommCounters()
        eng = AttentionEngine(plan, rank, dist.group.WORLD, counters=c)
        eng(q, k, v).sum().backward()  # warm-up
        c.reset()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(repeat):
            eng(q, k, v).sum().backward()
        dist.barrier()
        wall = (time.perf_counter() - t0) / repeat
        res[name] = {"tokens": t, "compute_s": sum(c.compute_s.values()) / repeat,
                     "compute_cpu_s": sum(c.compute_cpu_s.values()) / repeat,
                     "by_queue_s": {k_: v_ / repeat for k_, v_ in c.compute_s.items()},
                     "bytes": {k_: v_ // repeat for k_, v_ in c.bytes_by_link.items()}, "wall_s": wall}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--gpus-per-node", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=12000)
    ap.add_argument("--longest", type=int, default=4000)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strategies", default="zeppelin,packed_dp,static_cp")
    ap.add_argument("--out", default="benchmarks/results/engine.json")
    a = ap.parse_args(argv)
    topo = Topology(a.nodes, a.gpus_per_node)
    lengths = make_batch(a.seed, a.tokens, a.longest)
    model = ModelSpec(name="bench", layers=1, hidden=a.heads * a.head_dim, heads=a.heads, kv_heads=a.kv_heads,
                      ffn=4 * a.heads * a.head_dim, vocab=1000)
    cfg = ZeppelinConfig(gpus_per_node=a.gpus_per_node, capacity_tokens=sum(lengths))
    plans = [(s, plan_batch(lengths, topo, TOY_PROFILE, model, cfg, strategy=s)) for s in a.strategies.split(",")]
    per_rank = run_distributed(_rank, topo.world_size, plans, a.heads, a.kv_heads, a.head_dim, a.repeat,
                               timeout=1800)
    out = {"topology": topo.describe(), "lengths": lengths, "heads": a.heads, "kv_heads": a.kv_heads,
           "head_dim": a.head_dim, "repeat": a.repeat, "strategies": {}}
    for name, plan in plans:
        comp = [r[name]["compute_s"] for r in per_rank]
        cpu = [r[name]["compute_cpu_s"] for r in per_rank]
        out["strategies"][name] = {
            "compute_cpu_max_s": max(cpu), "compute_cpu_mean_s": sum(cpu) / len(cpu),
            "cpu_max_over_mean": max(cpu) / (sum(cpu) / len(cpu)),
            "compute_max_s": max(comp), "compute_mean_s": sum(comp) / len(comp),
            "max_over_mean": max(comp) / (sum(comp) / len(comp)),
            "wall_s": max(r[name]["wall_s"] for r in per_rank),
            "classes": plan.class_counts(), "per_rank": [r[name] for r in per_rank]}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    for name, s in out["strategies"].items():
        print(f"{name:10s} compute (CPU s) max {s['compute_cpu_max_s']:.3f} mean {s['compute_cpu_mean_s']:.3f} "
              f"max/mean {s['cpu_max_over_mean']:.2f} | (wall s) max {s['compute_max_s']:.3f} mean {s['compute_mean_s']:.3f} "
              f"max/mean {s['max_over_mean']:.2f} wall {s['wall_s']:.3f}s classes {s['classes']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
