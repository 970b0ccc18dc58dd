"""Validation: the simulator's predicted engine time against measured engine runs on this CPU.

For each strategy one batch (a long document plus a long tail of short ones) is planned on the CPU
topology (world 2: one node of 2; world 4: two virtual nodes of 2), and every rank runs the attention
engine's forward and backward on its share (float32, CPU_MODEL's heads); the measured time of an
iteration is the slowest rank's, from a common barrier, median over repeats (each repeat runs every
strategy once, round robin in a shuffled order, so a slow minute of a shared machine lands on all of them; with more ranks than
cores one iteration's time depends on where the scheduler puts the ranks: packed_dp at world 4 took
153-209 ms within one run, and the minimum picks the luckiest placement). The simulator predicts
the same quantity (iteration.attention_graph: one layer's core attention, forward then backward)
from a profile calibrated in the same spawned run (validation/concurrent.py: single-core compute
rates and the host's cores, which the simulator shares among the ranks computing at once). The
whole calibration is sampled before, mid-way through and after the timed repeats, and every figure
is the median over ranks and samples (validation/concurrent.py ``profile_from`` says what one sample
alone moved). The plans are made from the first sample, before anything runs, and those same plans
are simulated.

This machine is shared: other processes' CPU time during each timed repeat is measured (the host's
busy time from /proc/stat minus the ranks' own) and repeats where others kept more than
BACKGROUND_MAX cores busy are not used; a row with no clean repeat is marked ``clean: false``.

Each row also holds all ranks' CPU seconds of a pass (``measured_cpu_s``, gloo's transport threads
included) next to the CPU time the simulated pass charges on this machine's cores
(``simulated_cpu_s``, events.TaskGraph.cpu_occupancy; ``simulated_work_s``: its work at one core's
speed): a time error with the same CPU error is work the model leaves out; a time error alone is
waiting (idle cores) it gets wrong.

The host's own speed drifts within a run (validation_probes/bench_host_drift.py), so every rank also runs a
short fixed reference round (validation/host_speed.py) right before and after each timed pass and
REF_ROUNDS times around each calibration sample; each row reports, beside the raw error, the error
against its repeats scaled to the calibration's host speed (``error_at_calibration``; ``host_speed``
per repeat, below 1 when the host was slower than while calibrating). The raw error stays the headline.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from typing import List, NamedTuple, Optional, Sequence

from megatron_zeppelin.spec.config import STRATEGIES, ZeppelinConfig
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.validation.concurrent import CPU_MODEL
from megatron_zeppelin.validation.cpu_profile import CpuProfile
from megatron_zeppelin.validation.host_speed import at_calibration, host_speed
from megatron_zeppelin.sim.iteration import attention_graph


BACKGROUND_MAX = 0.25  # cores of other processes above which a timed repeat is not used
REF_ROUNDS = 3  # reference rounds before and after each calibration sample (validation/host_speed.py)


class TimedPass(NamedTuple):
    """One rank's record of one timed pass (``_rank``)."""
    seconds: float  # from the common barrier to this rank's end of the backward
    cpu_s: float  # this rank's CPU seconds, barrier to barrier (gloo's transport threads included)
    host_busy_s: float  # the host's busy seconds meanwhile (/proc/stat; rank 0's is the one read)
    window_s: float  # wall seconds from the barrier to the one closing the pass
    ref_before: float  # the reference round right before the pass (validation/host_speed.py)
    ref_after: float  # and right after


class RankRun(NamedTuple):
    """What one rank of the validation's spawned run returns."""
    profiles: Optional[tuple]  # rank 0: (planned, simulated CpuProfile as dicts, host cores per sample)
    passes: List[List[TimedPass]]  # [strategy][repeat], the warm-up left out
    calib_ref: List[float]  # this rank's reference rounds around each calibration sample


def make_batch(seed: int, tokens: int, longest: int) -> List[int]:
    """One long document plus a long tail of short ones (variable-length data)."""
    rng = random.Random(seed)
    out = [longest]
    while sum(out) < tokens:
        out.append(max(16, min(longest, int(rng.lognormvariate(5.0, 1.0)))))
    return out


def cpu_topology(world: int) -> Topology:
    return Topology(2, world // 2, world // 2) if world >= 4 else Topology(1, world, world)


def cpu_config(topo: Topology, strategy: str) -> ZeppelinConfig:
    """The planner's config for one strategy. static_cp and allgather_cp are pinned at CP = world:
    the validation tests the simulator, and their predicted-best CP size on a CPU is 1 (packed_dp
    again), which would leave their ring exchanges unmeasured."""
    cp = topo.world_size if strategy in ("static_cp", "allgather_cp") else 0
    return ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node, cp_size=cp)


def _rank(rank: int, world: int, strategies: Sequence[str], lengths: Sequence[int], calib_repeat: int,
          repeat: int):
    import torch
    import torch.distributed as dist

    from megatron_zeppelin.attention.engine import AttentionEngine
    from megatron_zeppelin.planner import plan_batch
    from megatron_zeppelin.validation.concurrent import host_cores, measure, profile_from
    from megatron_zeppelin.validation.host_speed import reference, reference_round

    from megatron_zeppelin.validation.heap import keep_heap
    keep_heap()  # as measure() does: the reference rounds meet one heap throughout
    ref = reference(rank)
    ref()  # first-call costs are not the host's speed
    calib_ref = []  # this rank's reference rounds around each calibration sample (host_speed.py)

    def sample():  # every rank's measurements, the same list on every rank
        calib_ref.extend(reference_round(ref) for _ in range(REF_ROUNDS))
        every = [None] * world
        dist.all_gather_object(every, measure(rank, world, calib_repeat))
        calib_ref.extend(reference_round(ref) for _ in range(REF_ROUNDS))
        return every
    samples = [sample()]
    planned = profile_from(samples, world)  # the same on every rank: the plans are made from it (and its host)
    topo = cpu_topology(world)
    m = CPU_MODEL
    runs = []
    for s in strategies:
        plan = plan_batch(list(lengths), topo, planned.profile, m, cpu_config(topo, s), strategy=s, host=planned.host)
        runs.append((plan.tokens(rank), AttentionEngine(plan, rank, None)))
    times = [[] for _ in strategies]
    # Round robin: repeat i runs every strategy once, so a slow minute of this shared machine lands
    # on all of them alike, in an order of its own (the same on every rank), so that no strategy
    # always follows the same one (two strategies with the same plan, one always after a ring plan,
    # were measured up to 16% apart); fresh inputs every time (the same values), so where the allocator
    # puts them, which can set a kernel's speed for as long as they live, changes between repeats too.
    for i in range(repeat + 1):  # the first is a warm-up
        order = list(range(len(runs)))
        random.Random(i).shuffle(order)
        for j in order:
            t, eng = runs[j]
            g = torch.Generator().manual_seed(rank)
            q = torch.randn(t, m.heads, m.head_dim, generator=g, requires_grad=True)
            k = torch.randn(t, m.kv_heads, m.head_dim, generator=g, requires_grad=True)
            v = torch.randn(t, m.kv_heads, m.head_dim, generator=g, requires_grad=True)
            dout = torch.randn(t, m.heads, m.head_dim, generator=g)
            before = reference_round(ref)  # the host's speed right before and after the pass
            dist.barrier()
            b0, c0 = host_busy_s(), time.process_time()
            t0 = time.perf_counter()
            eng(q, k, v).backward(dout)
            dt = time.perf_counter() - t0
            dist.barrier()  # the load window closes when every rank is done
            window = (time.process_time() - c0, host_busy_s() - b0, time.perf_counter() - t0)
            after = reference_round(ref)
            if i:
                times[j].append(TimedPass(dt, *window, before, after))
        if i in (repeat // 2, repeat):  # the whole calibration again mid-way and at the end
            samples.append(sample())
    profile = profile_from(samples, world)  # the profile simulated: medians over the three samples
    # each sample's own host_cores beside the profile's median: a sample on a stretch where the host
    # delivered fewer cores (validation_probes/bench_host_cores.py) shows here
    per_sample = [host_cores([x]) for x in samples]
    return RankRun((planned.to_dict(), profile.to_dict(), per_sample) if rank == 0 else None, times, calib_ref)


def host_busy_s() -> float:
    """Seconds the host's CPUs have been busy since boot (/proc/stat: all but idle and iowait; steal
    counts, as other guests of a hypervisor take it); nan where there is no /proc."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return float("nan")
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def background_cores(per_rank: Sequence[TimedPass]) -> float:
    """Cores that other processes kept busy during one timed repeat: the host's busy seconds minus
    the ranks' own CPU seconds, over the window (``per_rank[r]``: rank r's record of the pass; the
    host figures are rank 0's). /proc/stat counts in 10 ms ticks.

    >>> a, b = TimedPass(0.1, 0.1, 0.3, 0.2, 1.0, 1.0), TimedPass(0.1, 0.1, 0.0, 0.2, 1.0, 1.0)
    >>> round(background_cores([a, b]), 6)  # 0.1 s of others in 0.2 s
    0.5
    """
    own = sum(r.cpu_s for r in per_rank)
    return max(0.0, per_rank[0].host_busy_s - own) / per_rank[0].window_s


def validate(world: int, strategies: Sequence[str] = STRATEGIES, repeat: int = 3, calib_repeat: int = 5,
             tokens_per_rank: int = 2048, seed: int = 0):
    """(CpuProfile, rows): calibrate and measure in one spawned run, then simulate each plan."""
    from megatron_zeppelin.distributed.launch import run_distributed
    from megatron_zeppelin.planner import plan_batch
    lengths = make_batch(seed, tokens_per_rank * world, tokens_per_rank)
    res: List[RankRun] = run_distributed(_rank, world, tuple(strategies), lengths, calib_repeat, repeat, timeout=900)
    planned_d, profile_d, cores_per_sample = res[0].profiles
    planned, simulated = CpuProfile.from_dict(planned_d), CpuProfile.from_dict(profile_d)
    calib_ref = [max(x) for x in zip(*(r.calib_ref for r in res))]  # slowest rank
    topo = cpu_topology(world)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    rows = []
    for j, s in enumerate(strategies):  # the plans the ranks ran, simulated on the whole run's profile
        plan = plan_batch(lengths, topo, planned.profile, CPU_MODEL, cpu_config(topo, s), strategy=s, host=planned.host)
        passes = [[r.passes[j][i] for r in res] for i in range(repeat)]  # per repeat, every rank's record
        per_iter = [max(x.seconds for x in p) for p in passes]  # slowest rank
        cpu = [sum(x.cpu_s for x in p) for p in passes]  # all ranks' CPU
        bg = [background_cores(p) for p in passes]
        clean = [i for i, b in enumerate(bg) if not b > BACKGROUND_MAX]  # nan (no /proc): kept
        keep = clean or list(range(repeat))
        measured = statistics.median(per_iter[i] for i in keep)
        speed = [host_speed(calib_ref, [max(x.ref_before for x in p), max(x.ref_after for x in p)]) for p in passes]
        at_calib = statistics.median(at_calibration(per_iter[i], speed[i]) for i in keep)
        g, links = attention_graph(plan, simulated.profile, CPU_MODEL, host=simulated.host)
        sim = g.run(links.capacity)
        predicted = sim.makespan
        # Where a miss lies: the CPU time the ranks took (with their transport threads, barrier to
        # barrier) against the CPU time the simulated pass charges; the rest of a pass is waiting.
        measured_cpu, simulated_cpu = statistics.median(cpu[i] for i in keep), g.cpu_occupancy(sim, cores)
        rows.append({"world": world, "strategy": s, "measured_s": measured,
                     "measured_min_s": min(per_iter[i] for i in keep), "predicted_s": predicted,
                     "error": predicted / measured - 1.0, "host_speed": speed,
                     "measured_at_calibration_s": at_calib, "error_at_calibration": predicted / at_calib - 1.0,
                     "host_cores_per_sample": cores_per_sample,
                     "measured_cpu_s": measured_cpu,
                     "simulated_cpu_s": simulated_cpu, "simulated_work_s": g.cpu_seconds(),
                     "cpu_error": simulated_cpu / measured_cpu - 1.0,
                     "repeats": per_iter, "background_cores": bg,
                     "clean": bool(clean), "classes": plan.class_counts(),
                     "documents": len(lengths), "tokens": sum(lengths), "ops": len(plan.schedule)})
    return simulated, rows
