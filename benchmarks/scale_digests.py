"""Plan digests of bench_planner's scale batches: a change meant to keep the plans identical (e.g.
a faster partitioner) must print the same digests before and after.

The batches are built as ``bench_planner.py --scale`` builds them (scale_case: the mix's lengths,
seed 0, cut at 64K; nodes of 8 GPUs; a800, llama-7b), each planned by one Planner. Prints one line
per case, ``mix docs ranks digest seconds``; ``--profile`` also prints cProfile's top functions (own
time) of each case's plan.

    PYTHONPATH=. .venv/bin/python benchmarks/scale_digests.py --docs 1000 16000 32000 128000 > results/bench/scale_digests.txt
    git archive 0f6491c megatron_zeppelin | tar -x -C DIR   # an older tree, for its digests
    PYTHONPATH=DIR .venv/bin/python benchmarks/scale_digests.py --docs 1000 16000 32000 > results/bench/scale_digests_before.txt
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

from megatron_zeppelin.data.workloads import cut_to_context, load_distribution
from megatron_zeppelin.planner import Planner
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.topology import Topology


def digest(mix: str, n_docs: int, prof, model, profile: bool = False):
    """(digest, planning seconds) of the scale batch of ``n_docs`` documents (about 16 a rank)."""
    nodes = max(1, round(n_docs / 125))  # bench_planner.SCALE_CASES: 1000 -> 8, 16000 -> 128, 128000 -> 1024
    lengths = cut_to_context(load_distribution(mix).draw(np.random.default_rng(0), n_docs), 65536).astype(np.int64)
    topo = Topology(nodes, 8, prof.nics_per_node, prof.gpu_to_nic)
    planner = Planner(topo, prof, model, ZeppelinConfig(gpus_per_node=8))
    prof_ = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof_:
        prof_.enable()
    plan = planner.plan(lengths)
    if prof_:
        prof_.disable()
        pstats.Stats(prof_).sort_stats("tottime").print_stats(15)
    return plan.digest(), time.perf_counter() - t0, topo.world_size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, nargs="+", default=[1000, 16000])
    ap.add_argument("--mixes", nargs="+", default=["prolong64k", "arxiv"])
    ap.add_argument("--cluster", default="a800")
    ap.add_argument("--model", default="llama-7b")
    ap.add_argument("--profile", action="store_true", help="cProfile each case (top 15 by own time)")
    args = ap.parse_args(argv)
    prof, model = load_profile(args.cluster), load_model(args.model)
    for mix in args.mixes:
        for n in args.docs:
            d, s, world = digest(mix, n, prof, model, args.profile)
            print(f"{mix} {n} {world} {d} {s:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
