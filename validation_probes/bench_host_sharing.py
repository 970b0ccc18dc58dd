"""Host sharing by kind of work: the cores the CPU validation's ranks get computing at once, per plan.

The simulator shares the host's cores among the ranks computing at once with one number per run,
the host's ``cores`` (spec/host.py, sim/host.py), measured by validation/concurrent.py's sharing
probe. This benchmark asks whether one number fits every plan: for each strategy's plan of the
validation batch (validation/validate.py: same batch, topology and config) every rank runs the layer program's Compute instructions only
(forward then backward, no exchanges: K/V blocks of the right sizes stand in for the received ones),
first alone (the ranks take turns) and then all at once from a barrier, ``--repeat`` times. Per
repeat and strategy:

- ``cores``: the ranks' alone seconds summed over the time until the last is done together, i.e. the
  host ``cores`` that would make the simulator's sharing exact for that plan's compute;
- ``cpu_inflation``: each rank's CPU seconds together over its CPU seconds alone (median over ranks):
  above 1 the same work costs more CPU next to computing peers;
- ``alone_over_model``: the ranks' computes alone (CPU, median over repeats) over the cost model's
  single-core seconds of the same Computes (program.AttentionWork, the profile and host calibrated in the run):
  whether the calibrated tables price the engine's calls as they run back to back.

The probe's own host ``cores`` (calibrated in the same spawned run) is reported next to them. Timings
on a shared machine are noisy: compare strategies within one run, over several repeats.

    .venv/bin/python validation_probes/bench_host_sharing.py --world 4 --repeat 4 --json out/host_sharing.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from megatron_zeppelin.validation.concurrent import CPU_MODEL, measure, profile_from
from megatron_zeppelin.spec.config import STRATEGIES
from megatron_zeppelin.validation.validate import cpu_config, cpu_topology, make_batch


def _computes_only(eng, rank: int, torch):
    """A function running ``eng``'s program's Compute instructions on fresh inputs, forward then
    backward; returns the CPU seconds spent in them."""
    from megatron_zeppelin.attention.runner import LayerRun
    from megatron_zeppelin.planner.program import Compute
    m, t = CPU_MODEL, eng.view.tokens

    def run() -> float:
        g = torch.Generator().manual_seed(rank)
        q = torch.randn(t, m.heads, m.head_dim, generator=g)
        k = torch.randn(t, m.kv_heads, m.head_dim, generator=g)
        v = torch.randn(t, m.kv_heads, m.head_dim, generator=g)
        out, lse = torch.zeros(q.shape), torch.full(q.shape[:2], float("-inf"))
        cpu = 0.0
        for bw in (False, True):
            grads = (torch.randn(q.shape), torch.zeros(q.shape), torch.zeros(k.shape), torch.zeros(v.shape)) if bw else None
            local = ((lambda: eng._local_backward(q, k, v, out, lse, *grads)) if bw
                     else (lambda: eng._local_forward(q, k, v, out, lse)))
            lr = LayerRun(eng.context(), q, k, v, out, lse, local, grads=grads)
            for x in eng.program[bw]:
                if not isinstance(x, Compute):
                    continue
                for rid in lr.mine if x.queue != "local" else ():  # the blocks a real run would hold now
                    r = lr.ring_of[rid]
                    if r.comm == "p2p" and len(x.steps) == 1:
                        lr.held[rid] = torch.randn(eng.view.block_rows(r, lr._blk(rid, x.steps[0])), lr.width)
                    elif r.comm != "p2p":
                        for b in range(r.size):
                            lr.gathered[(rid, b, r.ranks[b])] = torch.randn(eng.view.block_rows(r, b), lr.width)
                c0 = time.thread_time()
                lr.compute(x)
                cpu += time.thread_time() - c0
        return cpu
    return run


def _engine_pass(eng, rank: int, torch):
    """The engine's whole forward and backward (exchanges included), on fresh inputs."""
    m, t = CPU_MODEL, eng.view.tokens

    def run() -> None:
        g = torch.Generator().manual_seed(rank)
        q = torch.randn(t, m.heads, m.head_dim, generator=g, requires_grad=True)
        k = torch.randn(t, m.kv_heads, m.head_dim, generator=g, requires_grad=True)
        v = torch.randn(t, m.kv_heads, m.head_dim, generator=g, requires_grad=True)
        eng(q, k, v).backward(torch.randn(t, m.heads, m.head_dim, generator=g))
    return run


def _rank(rank: int, world: int, strategies, repeat: int):
    import torch
    import torch.distributed as dist

    from megatron_zeppelin.attention.engine import AttentionEngine
    from megatron_zeppelin.planner import make_context, plan_batch
    from megatron_zeppelin.planner.program import AttentionWork, Compute
    mine = measure(rank, world, 5)
    every = [None] * world
    dist.all_gather_object(every, mine)
    profile, host = profile_from([every], world)
    topo = cpu_topology(world)
    lengths = make_batch(0, 2048 * world, 2048)
    runs, model = {}, {}
    for s in strategies:
        plan = plan_batch(list(lengths), topo, profile, CPU_MODEL, cpu_config(topo, s), strategy=s, host=host)
        eng = AttentionEngine(plan, rank, None)
        eng.scale = CPU_MODEL.head_dim ** -0.5
        runs[s] = (_computes_only(eng, rank, torch), _engine_pass(eng, rank, torch))
        # The cost model's single-core seconds of this rank's Computes (what the simulator charges).
        work = AttentionWork(make_context(topo, profile, CPU_MODEL, cpu_config(topo, s),
                                          total_tokens=sum(lengths), host=host).cost, plan.docs, plan.rings, world)
        model[s] = sum(float(work.seconds(x, bw)[rank]) for bw in (False, True)
                       for x in eng.program[bw] if isinstance(x, Compute))
    out = {s: [] for s in strategies}
    for _ in range(repeat):
        for s, (run, engine) in runs.items():  # round robin: a slow minute lands on every strategy
            alone = (float("nan"), float("nan"))
            for turn in range(world):
                dist.barrier()
                if rank == turn:
                    t0 = time.perf_counter()
                    c = run()
                    alone = (time.perf_counter() - t0, c)
            dist.barrier()
            t0 = time.perf_counter()
            c = run()
            together = (time.perf_counter() - t0, c)
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            engine()
            whole = (time.perf_counter() - t0, time.process_time() - c0)
            dist.barrier()
            out[s].append((alone, together, whole))
    return (host.cores if rank == 0 else None), out, model


def summarise(res, strategies, repeat: int) -> dict:
    """Per strategy and repeat: the cores delivered and the CPU inflation (see the module docstring)."""
    world = len(res)
    rows = {}
    for s in strategies:
        cores, infl, eng_cores, eng_infl = [], [], [], []
        for i in range(repeat):
            per = [res[r][1][s][i] for r in range(world)]  # (alone, together, engine): (wall, cpu) each
            cores.append(sum(a[0] for a, _, _ in per) / max(t[0] for _, t, _ in per))
            infl.append(statistics.median(t[1] / a[1] for a, t, _ in per if a[1] > 0))
            eng_cores.append(sum(a[0] for a, _, _ in per) / max(e[0] for _, _, e in per))
            eng_infl.append(statistics.median(e[1] / a[1] for a, _, e in per if a[1] > 0))
        rows[s] = {"cores": [round(x, 3) for x in cores], "cores_median": round(statistics.median(cores), 3),
                   "cpu_inflation": [round(x, 3) for x in infl],
                   "cpu_inflation_median": round(statistics.median(infl), 3),
                   "engine_cores": [round(x, 3) for x in eng_cores],
                   "engine_cores_median": round(statistics.median(eng_cores), 3),
                   "engine_cpu_inflation": [round(x, 3) for x in eng_infl],
                   "engine_cpu_inflation_median": round(statistics.median(eng_infl), 3)}
        if all(len(x) > 2 for x in res):  # the computes alone (median CPU over repeats) over the model's
            alone = sum(statistics.median(res[r][1][s][i][0][1] for i in range(repeat)) for r in range(world))
            rows[s]["alone_over_model"] = round(alone / sum(x[2][s] for x in res), 3)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=4, help="ranks (spawned processes)")
    ap.add_argument("--repeat", type=int, default=4, help="alone/together rounds per strategy")
    ap.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated strategies")
    ap.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args(argv)
    from megatron_zeppelin.distributed.launch import run_distributed
    strategies = tuple(args.strategies.split(","))
    print(f"calibrating and timing {len(strategies)} plans on {args.world} ranks ...", flush=True)
    res = run_distributed(_rank, args.world, strategies, args.repeat, timeout=900)
    rows = summarise(res, strategies, args.repeat)
    probe = res[0][0]
    print(f"sharing probe (the host's cores): {probe}")
    print(f"{'':14s} {'computes only':^24s} | {'the whole engine pass':^24s}")
    print(f"{'strategy':14s} {'cores':>11s} {'cpu inflation':>13s}| {'cores':>11s} {'cpu inflation':>13s}"
          f"  | computes alone / model  (medians over repeats)")
    for s, r in rows.items():
        print(f"{s:14s} {r['cores_median']:11.2f} {r['cpu_inflation_median']:13.2f}| {r['engine_cores_median']:11.2f} "
              f"{r['engine_cpu_inflation_median']:13.2f}  | {r['alone_over_model']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "validation_probes/bench_host_sharing.py " + " ".join(argv or []), "world": args.world,
                       "probe_host_cores": probe, "strategies": rows}, f, indent=1)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
