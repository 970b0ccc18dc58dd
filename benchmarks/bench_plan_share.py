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

(c) measured (``--gloo-ranks N``, default 4; 0 leaves it out): the case's real pickled Plan shared
    among N local gloo processes the way a run shares it (integration/plan_share.py): the broadcast
    alone (header + bytes over the sharing group; median over repeats of the slowest rank), and
    ``SharedPlanAhead.take`` on the receiving ranks for a batch shared ahead (their step's whole
    cost: unpickle + digest check), against the planning rank's.

Cases: 16 documents a rank (1k / 64, 16k / 1,024, 128k / 8,192 ranks as 1,024 nodes x 8), drawn from a
dataset mix (``--mix``, default arxiv; prolong64k's 128k plan takes tens of seconds on this host), cut
at 64K, seed 0; a800 profile, llama-7b. Writes JSON:

    PYTHONPATH=. .venv/bin/python benchmarks/bench_plan_share.py --out results/plansmall/plan_share.json
    PYTHONPATH=. .venv/bin/python benchmarks/bench_plan_share.py --relay-chunk-bytes 0 --max-ranks 1024 \
        --out results/share/plan_share.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import pickle
import statistics
import sys
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


class _Given:
    """The planning rank's stand-in planner in the gloo row: it returns the case's Plan (unpickled
    from its bytes, as a worker's answer is) for any lengths."""

    def __init__(self, payload: bytes):
        self.payload = payload

    def plan(self, lengths):
        return pickle.loads(self.payload)


def _gloo_share(rank: int, world: int, payload: bytes, repeats: int) -> dict:
    """One rank of the gloo row (run_distributed's body)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from megatron_zeppelin.integration.plan_ahead import Worker
    from megatron_zeppelin.integration.plan_share import SharedPlanAhead, share_group

    share = share_group(range(world), timedelta(seconds=300))
    bcast = []
    for _ in range(repeats):  # the transfer alone, as plan_share's thread does it
        dist.barrier()
        t0 = time.perf_counter()
        header = torch.tensor([0, len(payload), 0, 0], dtype=torch.int64)
        dist.broadcast(header, share.src, group=share.group)
        buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if share.planning \
            else torch.empty(int(header[1]), dtype=torch.uint8)
        dist.broadcast(buf, share.src, group=share.group)
        bcast.append(time.perf_counter() - t0)
    ahead = SharedPlanAhead(_Given(payload), share, worker=Worker.THREAD)
    takes = []
    try:
        for k in range(repeats):  # shared ahead: the step's cost is the take
            ahead.submit([k + 1])  # the sharing group is its thread's alone: barriers on the default group
            while not all(j.done.is_set() for j in ahead._pending.values()):
                time.sleep(0.01)
            dist.barrier()
            ahead.take([k + 1])
            takes.append(ahead.waited_s)
    finally:
        ahead.close()
    return {"broadcast_s": bcast, "take_s": takes}


def gloo_row(payload: bytes, ranks: int, repeats: int) -> dict:
    """The case's pickled Plan shared among ``ranks`` local gloo processes (medians over repeats;
    a repeat's broadcast is its slowest rank's)."""
    from megatron_zeppelin.distributed.launch import run_distributed

    res = run_distributed(_gloo_share, ranks, payload, repeats, timeout=600)
    bcast = [max(r["broadcast_s"][i] for r in res) for i in range(repeats)]
    recv = [t for r in res[1:] for t in r["take_s"]]
    return {"ranks": ranks, "broadcast_s": statistics.median(bcast), "receiver_take_s": statistics.median(recv),
            "planner_take_s": statistics.median(res[0]["take_s"])}


def case(n_docs: int, nodes: int, mix: str, repeats: int, prof, model, chunk=None, gloo_ranks: int = 0) -> dict:
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
            "gloo": gloo_row(data, gloo_ranks, max(repeats, 5)) if gloo_ranks > 1 else None,
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
    ap.add_argument("--gloo-ranks", type=int, default=4,
                    help="local gloo processes the measured row shares each case's Plan among (0: leave it out)")
    args = ap.parse_args(argv)
    prof, model = load_profile(args.cluster), load_model(args.model)
    rows = []
    for n, nodes in CASES:
        if nodes * 8 > args.max_ranks:
            continue
        r = case(n, nodes, args.mix, args.repeats, prof, model, args.relay_chunk_bytes, args.gloo_ranks)
        rows.append(r)
        print(f"{r['docs']:6d} docs {r['ranks']:5d} ranks: plan {1e3 * r['plan_s']:.1f} ms; share: "
              f"{r['plan_bytes'] / 2**20:.2f} MiB, pickle {1e3 * r['pickle_s']:.1f} ms, broadcast "
              f"{1e3 * r['broadcast_s']:.2f} ms, unpickle + digest {1e3 * r['unpickle_and_digest_s']:.1f} ms "
              f"(unpickle {1e3 * r['unpickle_s']:.1f}; digest {1e3 * r['digest_s']:.1f}, as JSON "
              f"{1e3 * r['json_digest_s']:.1f}); per rank: plan {1e3 * r['plan_s']:.1f} vs receive "
              f"{1e3 * r['unpickle_and_digest_s']:.1f} ms; critical path: plan {1e3 * r['plan_s']:.1f} vs share "
              f"{1e3 * r['one_plans_and_shares']['critical_path_s']:.1f} ms (load {r['load_average']:.1f})", flush=True)
        if r["gloo"]:
            g = r["gloo"]
            print(f"    measured on {g['ranks']} gloo processes: broadcast {1e3 * g['broadcast_s']:.1f} ms; take on a "
                  f"receiver {1e3 * g['receiver_take_s']:.1f} ms, on the planning rank {1e3 * g['planner_take_s']:.1f} ms",
                  flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"cluster": args.cluster, "model": args.model, "relay_chunk_bytes": args.relay_chunk_bytes,
                   "command": "benchmarks/bench_plan_share.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                   "cases": rows}, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
