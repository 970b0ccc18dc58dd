"""Where the CPU validation's engine time goes, per rank and instruction kind, next to the model.

Runs the validation itself (validation/validate.py ``_rank``: the same calibration, batch, plans, round
robin and repeats as ``zeppelin bench --validate-cpu``) with every instruction of the layer program
(attention/runner.py ``LayerRun.compute``, ``post``, ``wait``) and every ``P2PExchange.start``
(the gloo posting inside a Post) timed: CPU seconds of the rank's own thread and wall seconds. Per
strategy and rank (medians over the timed passes): the pass's wall, the main thread's CPU and the
whole process's (the difference is gloo's transport threads), each instruction kind's CPU / wall,
the main thread's CPU outside any instruction (the engine's own setup: packing the own K/V,
accumulators, autograd), and the model's single-core compute of that rank's Computes
(program.AttentionWork with the profile and host calibrated in the same run), its Posts' host CPU
and its packing of own rows (AttentionWork.pack, each pass; spec/host.py HostModel).

    .venv/bin/python validation_probes/bench_validation_cpu.py --world 2 --json out/validation_cpu.json

Timings on a shared machine are noisy: compare ranks and strategies within one run.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time

KINDS = ("compute", "post", "wait")


def _rank(rank, world, strategies, lengths, calib_repeat, repeat):
    from megatron_zeppelin.attention import engine as E
    from megatron_zeppelin.attention import runner as R
    from megatron_zeppelin.distributed import p2p as P
    from megatron_zeppelin.validation import validate as V
    cur = {"acc": None}  # the pass being timed; None between passes (the calibration's own calls)
    stats = collections.defaultdict(lambda: collections.defaultdict(list))

    def timed(fn, name):
        def run(*a):
            c0, w0 = time.thread_time(), time.perf_counter()
            out = fn(*a)
            acc = cur["acc"]
            if acc is not None:
                acc[name + "_cpu"] += time.thread_time() - c0
                acc[name + "_wall"] += time.perf_counter() - w0
            return out
        return run
    for k in KINDS:
        setattr(R.LayerRun, k, timed(getattr(R.LayerRun, k), k))
    P.P2PExchange.start = timed(P.P2PExchange.start, "p2p_start")
    call, backward = E.AttentionEngine.__call__, E._EngineFunction.backward

    def engine_call(self, q, k, v):
        cur["acc"] = collections.defaultdict(float)
        cur["t0"] = (time.thread_time(), time.perf_counter(), time.process_time())
        return call(self, q, k, v)

    def engine_backward(ctx, dout):
        out = backward(ctx, dout)
        t0, acc = cur["t0"], cur["acc"]
        acc["main_cpu"], acc["wall"] = time.thread_time() - t0[0], time.perf_counter() - t0[1]
        acc["process_cpu"] = time.process_time() - t0[2]
        for key, val in acc.items():
            stats[ctx.engine.plan.strategy][key].append(val)
        cur["acc"] = None
        return out
    E.AttentionEngine.__call__ = engine_call
    E._EngineFunction.backward = staticmethod(engine_backward)
    run = V._rank(rank, world, strategies, lengths, calib_repeat, repeat)
    # the first pass of each strategy is the warm-up
    per = {s: {k: statistics.median(v[1:]) for k, v in d.items()} for s, d in stats.items()}
    return run.profiles, run.passes, per


def model_terms(plan, cpu, world: int):
    """Per rank: the model's single-core seconds of its Computes, and the host CPU of its Posts
    (``cpu``: the CpuProfile calibrated in the run, validation/cpu_profile.py)."""
    from megatron_zeppelin.validation.concurrent import CPU_MODEL
    from megatron_zeppelin.planner.cost.cost_model import CostModel
    from megatron_zeppelin.planner.program import AttentionWork, Compute, Post, attention_program
    cost = CostModel(CPU_MODEL, cpu.profile, plan.topology, host=cpu.host)
    work = AttentionWork(cost, plan.docs, plan.rings, world)
    has_local = any(d.cls == "local" for d in plan.docs)
    progs = [attention_program(plan.rings, has_local, bw, plan.schedule) for bw in (False, True)]
    compute = [sum(float(work.seconds(x, bw)[r]) for bw, prog in enumerate(progs) for x in prog
                   if isinstance(x, Compute)) for r in range(world)]
    posts = sum(1 for prog in progs for x in prog if isinstance(x, Post))
    pack = [2.0 * float(work.pack[r]) for r in range(world)]  # each pass, forward and backward
    return compute, posts * cpu.host.post_s(), pack


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2, help="ranks (spawned processes)")
    ap.add_argument("--repeat", type=int, default=5, help="timed passes per strategy (after a warm-up)")
    ap.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args(argv)
    from megatron_zeppelin.validation.concurrent import CPU_MODEL
    from megatron_zeppelin.spec.config import STRATEGIES
    from megatron_zeppelin.distributed.launch import run_distributed
    from megatron_zeppelin.planner import plan_batch
    from megatron_zeppelin.validation.cpu_profile import CpuProfile
    from megatron_zeppelin.validation.validate import cpu_config, cpu_topology, make_batch
    world = args.world
    lengths = make_batch(0, 2048 * world, 2048)
    res = run_distributed(_rank, world, tuple(STRATEGIES), lengths, 5, args.repeat, timeout=900)
    planned, cpu = (CpuProfile.from_dict(d) for d in res[0][0][:2])  # the plans' and the simulated
    topo = cpu_topology(world)
    print(f"world {world}: host cores {cpu.host.cores:.2f}, copies {cpu.host.copy_GBps:.1f} GB/s, "
          f"{cpu.host.post_us:.0f} us per Post (ms below: CPU/wall)")
    out = {"command": "validation_probes/bench_validation_cpu.py " + " ".join(argv or []), "world": world,
           "profile": cpu.to_dict(), "strategies": {}}
    for j, s in enumerate(STRATEGIES):
        plan = plan_batch(list(lengths), topo, planned.profile, CPU_MODEL, cpu_config(topo, s), strategy=s,
                          host=planned.host)
        compute, posts, pack = model_terms(plan, cpu, world)
        measured = statistics.median(max(res[r][1][j][i][0] for r in range(world)) for i in range(args.repeat))
        rows = []
        print(f"{s}: measured {measured * 1e3:.1f} ms")
        for r in range(world):
            d = res[r][2][s]
            row = {k: d.get(k, 0.0) for k in ("wall", "main_cpu", "process_cpu", "p2p_start_cpu", "p2p_start_wall")
                   + tuple(f"{k}_{x}" for k in KINDS for x in ("cpu", "wall"))}
            row["outside_cpu"] = row["main_cpu"] - sum(row[f"{k}_cpu"] for k in KINDS)
            row["transport_cpu"] = row["process_cpu"] - row["main_cpu"]
            row["model_compute"], row["model_posts"], row["model_pack"] = compute[r], posts, pack[r]
            rows.append(row)
            ms = {k: 1e3 * v for k, v in row.items()}
            print(f"  rank {r}: wall {ms['wall']:6.1f} | compute {ms['compute_cpu']:5.1f}/{ms['compute_wall']:5.1f} "
                  f"(model {ms['model_compute']:5.1f}) | post {ms['post_cpu']:4.1f}/{ms['post_wall']:4.1f} (model "
                  f"{ms['model_posts']:3.1f}; gloo posting {ms['p2p_start_cpu']:4.1f}/{ms['p2p_start_wall']:4.1f}) | "
                  f"wait {ms['wait_cpu']:4.1f}/{ms['wait_wall']:4.1f} | outside {ms['outside_cpu']:4.1f} "
                  f"(model's packing {ms['model_pack']:3.1f}) | "
                  f"transport {ms['transport_cpu']:4.1f}")
        out["strategies"][s] = {"measured_s": measured, "ranks": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
