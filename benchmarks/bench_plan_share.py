"""Plan once per domain or on every rank: what each costs at 64, 1,024 and 8,192 simulated ranks.

(a) every rank plans the batch itself: each rank pays the planning time (a steady Planner's plan,
    wall seconds on this host), and that is also the critical path;
(b) one rank plans and the others receive the Plan: the planner pays the planning time and pickles
    the Plan (the plan-ahead worker's transfer form, integration/plan_process.py); the Plan's bytes
    are broadcast (priced with the profile's link model: a binomial tree over the nodes, each round
    one NIC message of latency + bytes / NIC bandwidth, then one NVLink hop inside each node; NCCL
    would pipeline it, so this is the slow end); every receiver unpickles it and checks its digest
    (``Plan.digest``, the check the forward step runs), its per-rank cost, and the critical path is
    planning + pickle + broadcast + unpickle + digest. The digest alone is also timed both ways: the
    binary form it hashes (planner/plan_digest.py) and the JSON rendering it hashed before.

Cases: 16 documents a rank (1k / 64, 16k / 1,024, 128k / 8,192 ranks as 1,024 nodes x 8), drawn from a
dataset mix (``--mix``, default arxiv; prolong64k's 128k plan takes tens of seconds on this host), cut
at 64K, seed 0; a800 profile, llama-7b. Writes JSON:

    PYTHONPATH=. .venv/bin/python benchmarks/bench_plan_share.py --out results/plansmall/plan_share.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import pickle
import statistics
import time

import numpy as np

from megatron_zeppelin.data.workloads import cut_to_context, load_distribution
from megatron_zeppelin.planner import Planner
from megatron_zeppelin.planner.plan_digest import plan_digest
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.topology import Topology

CASES = ((1000, 8), (16000, 128), (128000, 1024))  # (documents, nodes of 8)


def broadcast_s(nbytes: int, nodes: int, prof) -> float:
    """The Plan's bytes from one rank to every rank: ceil(log2(nodes)) NIC rounds, then one NVLink hop."""
    nic = prof.nic_latency_us * 1e-6 + nbytes / (prof.nic_GBps * 1e9)
    nv = prof.nvlink_latency_us * 1e-6 + nbytes / (prof.nvlink_GBps * 1e9)
    return math.ceil(math.log2(nodes)) * nic + nv if nodes > 1 else nv


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def case(n_docs: int, nodes: int, mix: str, repeats: int, prof, model, chunk=None) -> dict:
    lengths = cut_to_context(load_distribution(mix).draw(np.random.default_rng(0), n_docs), 65536).astype(np.int64)
    topo = Topology(nodes, 8, prof.nics_per_node, prof.gpu_to_nic)
    planner = Planner(topo, prof, model, ZeppelinConfig(gpus_per_node=8, relay_chunk_bytes=chunk))
    plan = planner.plan(lengths)  # the run's first plan builds its cost model
    plan_s = _median_s(lambda: planner.plan(lengths), repeats)
    data = pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)
    digest = plan.digest()
    dump_s = _median_s(lambda: pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL), repeats)

    def receive():
        got = pickle.loads(data)
        if got.digest() != digest:
            raise RuntimeError("digest mismatch")

    recv_s = _median_s(receive, repeats)
    loads_s = _median_s(lambda: pickle.loads(data), repeats)
    # the digest alone, on the plan's content (not its kept value): the binary form Plan.digest hashes
    # now, against the JSON rendering it hashed before
    digest_s = _median_s(lambda: plan_digest(plan), repeats)
    json_digest_s = _median_s(lambda: hashlib.sha256(plan.to_json().encode()).hexdigest(), repeats)
    bcast = broadcast_s(len(data), nodes, prof)
    shared = plan_s + dump_s + bcast + recv_s
    return {"docs": int(len(lengths)), "ranks": topo.world_size, "mix": mix, "plan_s": plan_s,
            "plan_bytes": len(data), "pickle_s": dump_s, "unpickle_s": loads_s, "unpickle_and_digest_s": recv_s,
            "digest_s": digest_s, "json_digest_s": json_digest_s,
            "broadcast_s": bcast,
            "every_rank_plans": {"per_rank_cpu_s": plan_s, "critical_path_s": plan_s},
            "one_plans_and_shares": {"per_rank_cpu_s": recv_s, "planner_cpu_s": plan_s + dump_s,
                                     "critical_path_s": shared},
            "cheaper_per_rank": "share" if recv_s < plan_s else "plan",
            "faster_critical_path": "share" if shared < plan_s else "plan",
            "load_average": os.getloadavg()[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/plansmall/plan_share.json")
    ap.add_argument("--mix", default="arxiv", help="dataset mix of the batches (data/workloads)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cluster", default="a800")
    ap.add_argument("--model", default="llama-7b")
    ap.add_argument("--max-ranks", type=int, default=8192, help="leave out larger cases")
    ap.add_argument("--relay-chunk-bytes", type=int, default=None,
                    help="--zeppelin-relay-chunk-bytes of the plans (default: the profile's; 0: unpipelined relays, "
                         "whose routed fixed shapes prepare in seconds where 2 MiB chunks take minutes at 1k arxiv)")
    args = ap.parse_args(argv)
    prof, model = load_profile(args.cluster), load_model(args.model)
    rows = []
    for n, nodes in CASES:
        if nodes * 8 > args.max_ranks:
            continue
        r = case(n, nodes, args.mix, args.repeats, prof, model, args.relay_chunk_bytes)
        rows.append(r)
        print(f"{r['docs']:6d} docs {r['ranks']:5d} ranks: plan {1e3 * r['plan_s']:.1f} ms; share: "
              f"{r['plan_bytes'] / 2**20:.2f} MiB, pickle {1e3 * r['pickle_s']:.1f} ms, broadcast "
              f"{1e3 * r['broadcast_s']:.2f} ms, unpickle + digest {1e3 * r['unpickle_and_digest_s']:.1f} ms "
              f"(unpickle {1e3 * r['unpickle_s']:.1f}; digest {1e3 * r['digest_s']:.1f}, as JSON "
              f"{1e3 * r['json_digest_s']:.1f}); per rank: plan {1e3 * r['plan_s']:.1f} vs receive "
              f"{1e3 * r['unpickle_and_digest_s']:.1f} ms; critical path: plan {1e3 * r['plan_s']:.1f} vs share "
              f"{1e3 * r['one_plans_and_shares']['critical_path_s']:.1f} ms (load {r['load_average']:.1f})", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"cluster": args.cluster, "model": args.model, "relay_chunk_bytes": args.relay_chunk_bytes,
                   "cases": rows}, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
