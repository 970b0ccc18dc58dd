"""Point-to-point bandwidth and latency between two ranks (gloo on CPU, NCCL on GPUs).

Rank ``a`` sends messages of growing size to rank ``b`` and back (ping-pong); one-way time = half the
round trip. Latency = the smallest message's one-way time; bandwidth = the largest message's bytes over
its one-way time minus the latency (the alpha-beta model the cost model uses).
"""

from __future__ import annotations

import statistics
import time
from typing import Dict, Sequence

import torch
import torch.distributed as dist


def ping_pong(a: int, b: int, sizes: Sequence[int], device: str, group=None, repeats: int = 5) -> Dict:
    """Run on every rank of ``group``; ranks other than a and b return {}."""
    me = dist.get_rank(group)
    if me not in (a, b):
        return {}
    peer = b if me == a else a
    peer_global = dist.get_global_rank(group, peer) if group is not None else peer
    res = {}
    for n in sizes:
        buf = torch.zeros(max(1, n // 4), dtype=torch.float32, device=device)
        times = []
        for _ in range(repeats + 1):
            if device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            if me == a:
                dist.send(buf, peer_global, group=group)
                dist.recv(buf, peer_global, group=group)
            else:
                dist.recv(buf, peer_global, group=group)
                dist.send(buf, peer_global, group=group)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t) / 2)
        res[n] = statistics.median(times[1:])
    lat = res[min(sizes)]
    big = max(sizes)
    bw = big / max(res[big] - lat, 1e-9)
    return {"latency_us": lat * 1e6, "GBps": bw / 1e9, "one_way_s": {str(k): v for k, v in res.items()}}


def _cpu_worker(rank, world, sizes, repeats):
    torch.set_num_threads(1)
    return ping_pong(0, 1, sizes, "cpu", None, repeats)


def cpu_link(sizes: Sequence[int] = (1 << 10, 1 << 20, 1 << 24), repeats: int = 5) -> Dict:
    """gloo between two local processes (the CPU 'link': both NVLink and NIC classes here)."""
    from megatron_zeppelin.distributed.launch import run_distributed

    return run_distributed(_cpu_worker, 2, list(sizes), repeats, timeout=120)[0]
