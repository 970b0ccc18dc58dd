"""Host cores over time: how many cores this machine delivers when all of its cores compute at once.

The CPU validation's simulator shares the host's cores among the ranks computing at once with one
number per run, the host's ``cores`` (spec/host.py, sim/host.py), from the calibration's sharing
probe. If the host sometimes delivers fewer cores than it shows (a hypervisor running two vCPUs on
one physical core for a while), a probe that lands on such a moment reads low and every plan is
simulated too slow.
This benchmark asks how often that happens, with nothing else to blame: one worker process per core,
each pinned to its core (one thread), times a fixed kernel (the validation model's GEMM, 1024 x
hidden x ffn, float32) ``--iters`` times; per round, first each worker alone in turn, then all at once
from a barrier. A round's ``cores`` is the alone seconds summed over the time until the last worker
is done together (the calibration's ``host_cores`` formula). Run it on an otherwise idle machine.

    .venv/bin/python validation_probes/bench_host_cores.py --rounds 60 --json out/host_cores.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Dict, Sequence

TIMEOUT_S = 120.0  # a worker that does not answer within this fails the run (it never hangs)


def summarise(cores: Sequence[float], shown: int) -> Dict:
    """Spread of per-round cores and the share of rounds that got at most ``shown`` - 0.5 of them.

    >>> s = summarise([2.0, 1.9, 1.1, 2.0], 2)
    >>> s["median"], s["min"], s["low_rounds"], s["low_share"]
    (1.95, 1.1, 1, 0.25)
    """
    low = sum(1 for c in cores if c <= shown - 0.5)
    return {"rounds": len(cores), "min": min(cores), "median": statistics.median(cores), "max": max(cores),
            "low_rounds": low, "low_share": low / len(cores)}


def _worker(cpu: int, iters: int, conn, barrier) -> None:
    os.sched_setaffinity(0, {cpu})
    import torch

    from megatron_zeppelin.validation.concurrent import CPU_MODEL
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(cpu)
    x, w = torch.randn(1024, CPU_MODEL.hidden, generator=g), torch.randn(CPU_MODEL.hidden, CPU_MODEL.ffn, generator=g)
    x @ w  # warm-up
    while True:
        cmd = conn.recv()
        if cmd == "stop":
            return
        if cmd == "together":
            barrier.wait(TIMEOUT_S)
        t = time.perf_counter()
        for _ in range(iters):
            x @ w
        conn.send(time.perf_counter() - t)


def _answer(conn, cpu: int) -> float:
    if not conn.poll(TIMEOUT_S):
        raise RuntimeError(f"worker on cpu {cpu} did not answer within {TIMEOUT_S:.0f} s")
    return conn.recv()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=60, help="rounds of alone-in-turn then together (default 60)")
    ap.add_argument("--iters", type=int, default=120, help="GEMMs per timing (default 120: about 0.5 s on one core here)")
    ap.add_argument("--json", default="", help="write every round and their spread here")
    args = ap.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:  # the spawned workers import this script by name (also when loaded by path)
        sys.path.insert(0, here)
    worker = importlib.import_module("bench_host_cores")._worker  # the object pickle finds by that name
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(cpus))
    pipes = [ctx.Pipe() for _ in cpus]
    procs = [ctx.Process(target=worker, args=(c, args.iters, child, barrier), daemon=True)
             for c, (_, child) in zip(cpus, pipes)]
    for p in procs:
        p.start()
    rounds = []
    try:
        for i in range(args.rounds):
            alone = []
            for c, (conn, _) in zip(cpus, pipes):
                conn.send("alone")
                alone.append(_answer(conn, c))
            for conn, _ in pipes:
                conn.send("together")
            together = [_answer(conn, c) for c, (conn, _) in zip(cpus, pipes)]
            cores = sum(alone) / max(together)
            rounds.append({"t": round(time.time(), 3), "alone_s": alone, "together_s": together, "cores": cores})
            print(f"round {i + 1:3d}: alone {' '.join(f'{1e3 * a:.0f}' for a in alone)} ms, together "
                  f"{' '.join(f'{1e3 * t:.0f}' for t in together)} ms: {cores:.2f} of {len(cpus)} cores", flush=True)
    finally:
        for (conn, _), p in zip(pipes, procs):
            if p.is_alive():
                conn.send("stop")
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    s = summarise([r["cores"] for r in rounds], len(cpus))
    print(f"{s['rounds']} rounds on {len(cpus)} cores: {s['min']:.2f} .. {s['max']:.2f} cores (median "
          f"{s['median']:.2f}); {s['low_rounds']} rounds ({100 * s['low_share']:.0f}%) at or below "
          f"{len(cpus) - 0.5:g}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "validation_probes/bench_host_cores.py", "cpus": cpus, "iters": args.iters,
                       "summary": s, "rounds": rounds}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
