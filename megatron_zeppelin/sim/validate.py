"""Validation: the simulator's predicted engine time against measured engine runs on this CPU.

For each strategy one batch (a long document plus a long tail of short ones) is planned on the CPU
topology (world 2: one node of 2; world 4: two virtual nodes of 2), and every rank runs the attention
engine's forward and backward on its share (float32, CPU_MODEL's heads); the measured time of an
iteration is the slowest rank's, from a common barrier, median over repeats. The simulator predicts
the same quantity (iteration.simulate_attention: one layer's core attention, forward then backward)
from a profile calibrated with the same number of ranks running at once.
"""

from __future__ import annotations

import random
import time
from typing import List, Sequence

from ..config import STRATEGIES, ZeppelinConfig
from ..profile import HardwareProfile
from ..topology import Topology
from ..calibrate.concurrent import CPU_MODEL
from .iteration import simulate_attention


def make_batch(seed: int, tokens: int, longest: int) -> List[int]:
    """One long document plus a long tail of short ones (variable-length data)."""
    rng = random.Random(seed)
    out = [longest]
    while sum(out) < tokens:
        out.append(max(16, min(longest, int(rng.lognormvariate(5.0, 1.0)))))
    return out


def cpu_topology(world: int) -> Topology:
    return Topology(2, world // 2, world // 2) if world >= 4 else Topology(1, world, world)


def _rank(rank: int, world: int, strategies: Sequence[str], lengths: Sequence[int], calib_repeat: int,
          repeat: int):
    import torch
    import torch.distributed as dist

    from ..attention.engine import AttentionEngine
    from ..planner import plan_batch
    from ..calibrate.concurrent import measure, profile_from
    mine = measure(rank, world, calib_repeat)
    every = [None] * world
    dist.all_gather_object(every, mine)
    profile = profile_from(every, world)  # the same on every rank
    topo = cpu_topology(world)
    config = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node)
    m = CPU_MODEL
    times = []
    for s in strategies:
        plan = plan_batch(list(lengths), topo, profile, m, config, strategy=s)
        t = plan.tokens(rank)
        g = torch.Generator().manual_seed(rank)
        q = torch.randn(t, m.heads, m.head_dim, generator=g, requires_grad=True)
        k = torch.randn(t, m.kv_heads, m.head_dim, generator=g, requires_grad=True)
        v = torch.randn(t, m.kv_heads, m.head_dim, generator=g, requires_grad=True)
        dout = torch.randn(t, m.heads, m.head_dim, generator=g)
        eng = AttentionEngine(plan, rank, None)
        ts = []
        for i in range(repeat + 1):  # the first is a warm-up
            dist.barrier()
            t0 = time.perf_counter()
            eng(q, k, v).backward(dout)
            ts.append(time.perf_counter() - t0)
            q.grad = k.grad = v.grad = None
        times.append(ts[1:])
    return (profile.to_dict() if rank == 0 else None), times


def validate(world: int, strategies: Sequence[str] = STRATEGIES, repeat: int = 3, calib_repeat: int = 5,
             tokens_per_rank: int = 2048, seed: int = 0):
    """(profile, rows): calibrate and measure in one spawned run, then simulate each plan."""
    from ..distributed.launch import run_distributed
    from ..planner import plan_batch
    lengths = make_batch(seed, tokens_per_rank * world, tokens_per_rank)
    res = run_distributed(_rank, world, tuple(strategies), lengths, calib_repeat, repeat, timeout=900)
    profile = HardwareProfile.from_dict(res[0][0])
    topo = cpu_topology(world)
    config = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node)
    rows = []
    for j, s in enumerate(strategies):
        plan = plan_batch(lengths, topo, profile, CPU_MODEL, config, strategy=s)
        per_iter = [max(res[r][1][j][i] for r in range(world)) for i in range(repeat)]  # slowest rank
        measured = min(per_iter)
        predicted = simulate_attention(plan, profile, CPU_MODEL)
        rows.append({"world": world, "strategy": s, "measured_s": measured, "predicted_s": predicted,
                     "error": predicted / measured - 1.0, "repeats": per_iter, "classes": plan.class_counts(),
                     "documents": len(lengths), "tokens": sum(lengths), "ops": len(plan.schedule)})
    return profile, rows
