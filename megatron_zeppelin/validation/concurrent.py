"""Calibrate a CpuProfile (a HardwareProfile and the HostModel of its ranks: validation/cpu_profile.py)
on this CPU with gloo inside the spawned run it will predict, as the simulator's validation needs it
(``zeppelin calibrate`` measures one process, on any device): attention rate by length (causal and
full blocks), the fixed cost of a block call, GEMM rate, the point-to-point bandwidth and latency
between ranks, the engine's own CPU per Post and per Wait of the layer program (``_exchanges``) and
packing its own rows at the start of a pass (``_pack_probe``), and the host's cores.

All ranks are processes of one host, and the simulator shares the host's cores among the ranks
computing at once (sim/host.py). So compute is measured on one core: the ranks take turns, each
measuring while the others sleep in a barrier; ``host_cores`` (HostModel.cores) is what all ranks
computing at once get: the cores the process may run on (``os.sched_getaffinity``), or fewer where
ranks slow each other down (shared caches and memory bandwidth, sibling hyperthreads: on this
project's 2-vCPU machine two ranks computing at once ran 1.2-1.65 cores' worth, not 2). Messages are
measured the other way, with every rank exchanging at once (a ring step over all ranks), because
their cost is the scheduling of the ranks: with more ranks than cores a blocked receiver runs only
when it gets a core back.

All ranks are on one host, so "NVLink" and "NIC" are the same gloo transport; the profile's
topology splits the ranks into virtual nodes only so that inter-node rings and routing get exercised.

Compute timings are the median call (the validation measures a median pass, and the minimum
of a hot loop ran 3-18% under a typical call of the same blocks here), message timings the median
round (the scheduling delay is part of the cost, not noise). Table probes spread their documents'
lengths over a window of ALIGN tokens around each table length: the CPU kernel runs lengths that
are multiples of 16 fastest (a causal block of 72 tokens took 184 us, one of 80 took 165 us), and
a table measured only there priced real documents, of any length, 10-15% too fast. The link
model latency + bytes / bandwidth goes through the smallest and the largest message (the middle
sizes are reported, not fitted: least squares let one noisy point swing the latency by milliseconds).

>>> bw, lat = fit_link([1000, 3000], [2e-6 + 1000 / 1e9, 2e-6 + 3000 / 1e9])
>>> round(bw), round(lat * 1e6, 6)
(1000000000, 2.0)
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Dict, Optional, Sequence, Tuple

from megatron_zeppelin.spec.model import ModelSpec
from megatron_zeppelin.spec.hardware import HardwareProfile
from megatron_zeppelin.spec.host import HostModel
from megatron_zeppelin.validation.cpu_profile import CpuProfile
from megatron_zeppelin.spec.words import DocClass

# The model the CPU validation runs (float32, head_dim 32, GQA 8/4).
CPU_MODEL = ModelSpec(name="cpu-validation", layers=1, hidden=256, heads=8, kv_heads=4, ffn=512, vocab=256,
                      dtype_bytes=4)
# Table points: zigzag chunks of the validation batches are mostly 4-100 tokens, where the time of a
# call is far from "fixed cost + FLOPs at one rate": dense points there keep the interpolation close.
SEQLENS = (16, 32, 48, 64, 96, 128, 256, 512, 1024, 2048)
CALL_LEN = 4  # a block this small measures fixed costs (per kernel call, per block)
LAND_CHUNK = 64  # chunk of the engine's exchange probe with large messages (8 MB: landing them costs CPU)
SPLIT_LENS = (16, 32, 64)  # chunk lengths of the own-block probe that measures a split sequence's extra
PROBE_DOCS = 64  # documents of the engine-path probe (2 blocks of CALL_LEN x CALL_LEN each)
P2P_ROUNDS = 21  # ring exchanges per message size (the median is kept)
SHARE_CHUNK = 32  # chunk of the sharing probe (the validation's zigzag chunks are mostly 4-100 tokens)
SHARE_ROUND_S = 0.2  # single-core seconds of one sharing round
SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22)
PACK_ROWS = 2048  # own rows of the pack probe (a validation rank's share)
ALIGN = 16  # the kernel's fast lengths are multiples of this: table probes spread over one period


def fit_link(nbytes: Sequence[float], seconds: Sequence[float]) -> Tuple[float, float]:
    i = min(range(len(nbytes)), key=lambda k: nbytes[k])
    j = max(range(len(nbytes)), key=lambda k: nbytes[k])
    slope = (seconds[j] - seconds[i]) / (nbytes[j] - nbytes[i])
    if slope <= 0:  # noise swamped the small message: all of the large one's time is transfer
        return nbytes[j] / seconds[j], seconds[i]
    return 1.0 / slope, max(0.0, seconds[i] - nbytes[i] * slope)


def _time_compute(fn, repeat: int, budget_s: float = 0.05) -> float:
    """Median of at least ``repeat`` calls and ``budget_s`` seconds of them, after warming up as
    long: a 0.1 ms call timed 7 times after one warm-up still carried first-call costs (seen: the
    fixed cost per block call read 140-270 us across runs instead of a steady 127 us)."""
    for least in (1, max(repeat, 1)):  # warm-up, then timed
        n, spent, times = 0, 0.0, []
        while n < least or spent < budget_s:
            t = time.perf_counter()
            fn()
            dt = time.perf_counter() - t
            n, spent = n + 1, spent + dt
            times.append(dt)
    return statistics.median(times)


def spread_lengths(length: int, n: int) -> list:
    """``n`` lengths around ``length`` within one ALIGN period, their residues mod ALIGN taken in a
    stride coprime to it (7): even a few documents mix odd and even lengths, early and late in the
    period, as real documents do (the kernel's cost climbs through each period: 127 tokens took 28%
    longer than 128); ``length`` itself where there is one document or it is at most ALIGN (a block
    that small costs its fixed part).

    >>> spread_lengths(64, 4), spread_lengths(64, 1), spread_lengths(16, 8)[:2]
    ([59, 66, 57, 64], [64], [16, 16])
    >>> sorted(x % 16 for x in spread_lengths(256, 16)) == list(range(16))
    True
    """
    if n < 2 or length <= ALIGN:
        return [length] * n
    return [length - ALIGN // 2 + (3 + 7 * i) % ALIGN for i in range(n)]


def _probe_docs(length: int) -> int:
    """Documents of a table probe of ``length``-token blocks: enough to spread over one ALIGN period,
    few enough that one call stays short (the 2048-token full probe is one: its backward takes ~0.3 s)."""
    return max(1, min(PROBE_DOCS, 512 // length), min(ALIGN // 2, 4096 // length) if length < 2048 else 1)


def _compute(rank: int, repeat: int) -> Dict:
    """Attention block times by length on the engine's own path (forward, backward; full blocks of a
    ring step, and local documents for the causal ones), its fixed costs, and a GEMM's, on one core."""
    import torch

    m = CPU_MODEL
    g = torch.Generator().manual_seed(rank)
    out: Dict = {"full_fwd": {}, "full_bwd": {}}
    # Everything through the engine's own block path, not a hot loop over one block: there a block
    # costs more (slicing the packed K/V message, strided copies: +10-20% for full blocks of 64-153
    # tokens; ring step 0 of 16-128-token chunks was 15-49% over a hot-loop causal table).
    for L in SEQLENS:
        n = _probe_docs(L)
        f, b, calls, flops = _probe(rank, L, n, spread=True)
        few = repeat if L <= 256 else min(repeat, 3)  # a 2048-token backward pair takes ~0.3 s
        out["full_fwd"][L] = _time_compute(f, few) / calls  # per block, its share of the one call included
        out["full_bwd"][L] = _time_compute(b, few) / calls
        out.setdefault("full_blocks", {})[L] = calls  # blocks in that one kernel call
        out.setdefault("full_flops", {})[L] = flops  # forward FLOPs per block (cost model's count)
        # As many local documents of about L tokens (one causal block, one sequence each, the local
        # queue's path), which gives the causal table (profile_from).
        f0, b0, flops0 = _local_probe(rank, L, n)
        out.setdefault("local_fwd", {})[L] = _time_compute(f0, few)
        out.setdefault("local_bwd", {})[L] = _time_compute(b0, few)
        out.setdefault("local_docs", {})[L] = n
        out.setdefault("local_flops", {})[L] = flops0  # forward FLOPs per document
    for L in SPLIT_LENS:  # ring step 0 of a member: its own block, one split sequence per document
        f, b = _probe(rank, L, _probe_docs(L), spread=True, member=0)[:2]
        out.setdefault("own_fwd", {})[L] = _time_compute(f, repeat)
        out.setdefault("own_bwd", {})[L] = _time_compute(b, repeat)
    x = torch.randn(1024, m.hidden, generator=g)
    w = torch.randn(m.hidden, m.ffn, generator=g)
    out["gemm"] = _time_compute(lambda: x @ w, repeat)
    out["engine_call"], out["engine_seq"] = _engine_call(rank, repeat)
    out["pack"] = _time_compute(_pack_probe(rank), repeat) / (PACK_ROWS * m.kv_bytes_per_token())  # s per byte
    return out


def _pack_probe(rank: int):
    """What starts each pass of the engine on a ring member (runner.LayerRun): its own rows (a
    zigzag member's two chunks of every document, as view.own_rows lists them) gathered from K and
    V into the message it holds (blocks.pack_kv), PACK_ROWS rows."""
    import torch

    from megatron_zeppelin.attention.blocks import pack_kv
    m = CPU_MODEL
    g = torch.Generator().manual_seed(rank)
    k, v = (torch.randn(2 * PACK_ROWS, m.kv_heads, m.head_dim, generator=g) for _ in range(2))
    chunk = PACK_ROWS // (2 * PROBE_DOCS)
    rows = [a + i for d in range(PROBE_DOCS) for a in (4 * chunk * d, 4 * chunk * d + 3 * chunk) for i in range(chunk)]
    return lambda: pack_kv(k[rows], v[rows])


def probe_ring(chunks: Sequence[int]):
    """(documents, ring) of the block probes: a ring of 2 members over one document of 4 x c
    tokens per chunk length c (zigzag: member 0 holds chunks 0 and 3, member 1 chunks 1 and 2)."""
    from megatron_zeppelin.planner.build.layout import zigzag_bounds
    from megatron_zeppelin.planner.types import DocPlan, Ring
    ring = Ring(0, (0, 1), DocClass.INTRA, tuple(range(len(chunks))))
    return tuple(DocPlan(i, 4 * c, DocClass.INTRA, 0, -1, zigzag_bounds(4 * c, 2)) for i, c in enumerate(chunks)), ring


def _probe(rank: int, chunk: int, ndocs: int = PROBE_DOCS, spread: bool = False, member: int = 1):
    """(forward, backward, blocks, forward FLOPs per full block): the engine's own block path (attention/blocks.attend and
    attend_backward: one kernel call) over one K/V block of a ring of 2 holding ``ndocs`` documents
    of 4 x ``chunk`` tokens (``probe_ring``), member 0's block (chunks 0 and 3). As member 1 at ring
    step 1: both its chunks see chunk 0 fully and chunk 3 not at all, so 2 full ``chunk`` x ``chunk``
    blocks per document, each its own sequence. (A member's later chunk against both chunks of a
    block, the other pattern, is one sequence of twice the keys, which the kernel runs faster per
    FLOP; a step's slowest member, which sets the ring's pace, has the first.) ``member`` 0: ring
    step 0, its own block: chunk 0 causal, and chunk 3 split (chunk 0 fully, then itself causally).
    ``spread``: document i's chunks are ``spread_lengths(chunk, ndocs)[i]`` tokens instead."""
    import torch

    from megatron_zeppelin.attention.blocks import _pairs, attend, attend_backward
    from megatron_zeppelin.planner.cost.cost_model import attention_flops
    from megatron_zeppelin.attention.view import RankView
    from megatron_zeppelin.planner.build.layout import attention_layout
    m = CPU_MODEL
    block = 0
    chunks = spread_lengths(chunk, ndocs) if spread else [chunk] * ndocs
    docs, ring = probe_ring(chunks)
    view = RankView.build(docs, (ring,), attention_layout(docs, (ring,), 2), member)
    calls = sum(1 for _ in _pairs(view, ring, block))
    g = torch.Generator().manual_seed(rank)
    q = torch.randn(view.tokens, m.heads, m.head_dim, generator=g)
    kv = torch.randn(view.block_rows(ring, block), 2 * m.kv_heads * m.head_dim, generator=g)
    out, lse = torch.zeros_like(q), torch.full((view.tokens, m.heads), float("-inf"))
    scale = m.head_dim ** -0.5
    attend(view, [(ring, block, kv)], q, out, lse, scale, "auto")  # a real output and LSE
    dkv, dq, dout = torch.zeros_like(kv), torch.zeros_like(q), torch.randn_like(q)
    return (lambda: attend(view, [(ring, block, kv)], q, out.clone(), lse.clone(), scale, "auto"),
            lambda: attend_backward(view, [(ring, block, kv, dkv)], q, out, lse, dout, dq, scale, "auto"), calls,
            2 * sum(attention_flops(c, c, False, m.heads * m.head_dim) for c in chunks) / calls)


def _local_probe(rank: int, length: int, ndocs: int):
    """(forward, backward, forward FLOPs per document): the engine's local queue (attention/kernels
    attend_pairs and attend_pairs_backward, as AttentionEngine._local_forward runs it: one kernel
    call) over ``ndocs`` documents of ``spread_lengths(length, ndocs)`` tokens, each one causal block."""
    import torch

    from megatron_zeppelin.attention.kernels import attend_pairs, attend_pairs_backward
    from megatron_zeppelin.planner.cost.cost_model import attention_flops
    m = CPU_MODEL
    g = torch.Generator().manual_seed(rank)
    lengths = spread_lengths(length, ndocs)
    t = sum(lengths)
    q = torch.randn(t, m.heads, m.head_dim, generator=g)
    k, v = (torch.randn(t, m.kv_heads, m.head_dim, generator=g) for _ in range(2))
    starts = [sum(lengths[:i]) for i in range(ndocs)]
    pairs = [(slice(a, a + n),) * 2 + (0,) for a, n in zip(starts, lengths)]
    out, lse = torch.zeros_like(q), torch.full((t, m.heads), float("-inf"))
    scale = m.head_dim ** -0.5
    attend_pairs(q, k, v, pairs, out, lse, scale, "auto")  # a real output and LSE
    dq, dk, dv, dout = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), torch.randn_like(q)
    return (lambda: attend_pairs(q, k, v, pairs, out.clone(), lse.clone(), scale, "auto"),
            lambda: attend_pairs_backward(dout, q, k, v, out, lse, pairs, dq, dk, dv, scale, "auto"),
            sum(attention_flops(n, n, True, m.heads * m.head_dim) for n in lengths) / ndocs)


def _engine_call(rank: int, repeat: int) -> Tuple[Tuple[float, float], Tuple[float, float]]:
    """(per kernel call, per sequence in a call), forward and backward, as the engine makes its
    calls (every block of a Compute packed in one call, the blocks of one query chunk merged into
    one sequence), on tiny blocks: ``_probe`` with CALL_LEN-token chunks over one document (2
    sequences) and over PROBE_DOCS (2 x PROBE_DOCS). The difference gives what each sequence adds
    (pairing segments, masks, slicing the packed K/V message, one kernel launch), the rest of the
    small call the fixed cost of a call (cu_seqlens, merge)."""
    one, many = _probe(rank, CALL_LEN, 1), _probe(rank, CALL_LEN)  # not spread: CALL_LEN <= ALIGN
    call, seq = [], []
    for i in (0, 1):
        t1, tn = _time_compute(one[i], repeat), _time_compute(many[i], repeat)
        per = max(tn - t1, 0.0) / (many[2] - one[2])
        seq.append(per)
        call.append(max(t1 - one[2] * per, 0.0))
    return tuple(call), tuple(seq)


def _exchanges(rank: int, world: int, repeat: int, chunk: int) -> Tuple[list, list, list]:
    """(posts, waits, copies): per repeat, this rank's mean CPU seconds (its own thread's: not the
    transport's, not the time blocked) per Post and per Wait of the layer program, and the bytes
    its messages moved (sent and received) per CPU second of the process's other threads (gloo's
    transport, copying them while the ranks compute), on the engine's own path
    (attention/runner.py), every rank running at once: one zigzag ring over all ranks holding
    PROBE_DOCS documents of ``chunk``-token chunks (every Wait lands one message of
    ``exchange_bytes(chunk)``), forward and backward, ``repeat`` times after a warm-up. The mean,
    not the median: a pass pays the whole tail (page faults of fresh buffers, a busy moment)."""
    import torch
    import torch.distributed as dist

    from megatron_zeppelin.attention.engine import AttentionEngine
    from megatron_zeppelin.attention.runner import LayerRun
    from megatron_zeppelin.attention.testing import hand_plan
    from megatron_zeppelin.planner.program import Compute, Post
    from megatron_zeppelin.spec.topology import Topology
    m = CPU_MODEL
    plan = hand_plan([2 * world * chunk] * PROBE_DOCS, Topology(1, world, world), [tuple(range(world))] * PROBE_DOCS)
    eng = AttentionEngine(plan, rank, None)
    eng.scale = m.head_dim ** -0.5
    t = plan.tokens(rank)
    g = torch.Generator().manual_seed(rank)
    q = torch.randn(t, m.heads, m.head_dim, generator=g)
    k, v = (torch.randn(t, m.kv_heads, m.head_dim, generator=g) for _ in range(2))
    posts, waits, copies = [], [], []
    for i in range(max(repeat, 3) + 1):  # the first is a warm-up
        out, lse = torch.zeros(q.shape), torch.full(q.shape[:2], float("-inf"))
        grads = (torch.randn(q.shape, generator=g), torch.zeros(q.shape), torch.zeros(k.shape), torch.zeros(v.shape))
        p, w = [], []
        dist.barrier()
        sent, cpu0, own0 = eng.counters.total_bytes(), time.process_time(), time.thread_time()
        for bw in (False, True):
            run = LayerRun(eng.context(), q, k, v, out, lse, lambda: None, grads=grads if bw else None)
            for x in eng.program[bw]:
                c = time.thread_time()
                if isinstance(x, Compute):
                    run.compute(x)
                    continue
                (run.post if isinstance(x, Post) else run.wait)(x)
                (p if isinstance(x, Post) else w).append(time.thread_time() - c)
        eng.tags.drain()
        dist.barrier()  # every message of the pass is in: the transport's CPU for it is spent
        others = (time.process_time() - cpu0) - (time.thread_time() - own0)
        if i:
            posts.append(statistics.mean(p))
            waits.append(statistics.mean(w))
            # a ring: each rank receives as many bytes as it sends
            copies.append(2.0 * (eng.counters.total_bytes() - sent) / others if others > 0 else 0.0)
    dist.barrier()
    return posts, waits, copies


def exchange_bytes(chunk: int) -> int:
    """Bytes of one message of ``_exchanges``'s ring: a member's K/V (or dK/dV) block, 2 chunks of
    each of PROBE_DOCS documents, float32."""
    return PROBE_DOCS * 2 * chunk * CPU_MODEL.kv_bytes_per_token()


def sharing_sample(rank: int, world: int, repeat: int) -> Tuple[float, list]:
    """(alone, rounds): single-core seconds of one round's work, a block sequence (``_probe`` with
    SHARE_CHUNK-token chunks, forward and backward) run until about SHARE_ROUND_S on this rank alone
    (the ranks take turns), and the seconds of each round with every rank running it at once from a
    barrier (host_cores turns them into the cores delivered). Rounds that long average the
    scheduler's time slices out: short ones gave 1.1 to 2.0 cores for 4 ranks from run to run."""
    import torch.distributed as dist
    fwd, bwd = _probe(rank, SHARE_CHUNK)[:2]

    def seq():
        fwd()
        bwd()
    alone = float("nan")
    for turn in range(world):
        dist.barrier()
        if rank == turn:
            alone = _time_compute(seq, repeat)
    n = max(1, int(SHARE_ROUND_S / alone))

    def round_():
        for _ in range(n):
            seq()
    rounds = []
    for i in range(max(repeat, 3) + 1):  # the first is a warm-up
        dist.barrier()
        t = time.perf_counter()
        round_()
        rounds.append(time.perf_counter() - t)
    dist.barrier()
    return n * alone, rounds[1:]


def measure(rank: int, world: int, repeat: int) -> Dict:
    """This rank's measurements (all ranks call it at once, inside torch.distributed). Freed host
    memory stays in the process from here on (heap.py), for the probes and whatever the process
    times after them."""
    import torch
    import torch.distributed as dist

    from megatron_zeppelin.validation.heap import keep_heap
    keep_heap()

    out: Dict = {"cores": len(os.sched_getaffinity(0))}  # the cores all ranks share (inherited affinity)
    # Single-core rates: one rank computes at a time while the others sleep in the barrier (the
    # simulator shares the host's cores among the ranks computing at once: sim/host.py).
    for turn in range(world):
        dist.barrier()
        if rank == turn:
            out.update(_compute(rank, repeat))
    dist.barrier()
    # What the ranks get computing at once: below the core count when they outnumber the cores, and
    # also when they do not but slow each other down (measured, not assumed: sim/host.py).
    out["sharing"] = sharing_sample(rank, world, repeat) if world > 1 else None
    # Point-to-point under the load the run will have: every rank sends to its ring successor and
    # receives from its predecessor at once (a ring step over all ranks), back to back. With more
    # ranks than cores a receiver blocked in wait() runs only when the scheduler gives it a core, so
    # the per-message cost is heavy-tailed (seen: 0.1 ms typical, 4 ms at times): the profile takes
    # the median round (per round the slowest rank), not the luckiest.
    out["p2p"] = {}
    if world > 1:
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        for n in SIZES:
            a = torch.zeros(n // 4)
            b = torch.empty(n // 4)
            times = []
            for i in range(P2P_ROUNDS + 1):  # the first is a warm-up
                t = time.perf_counter()
                reqs = [dist.isend(a, nxt), dist.irecv(b, prv)]
                for r in reqs:
                    r.wait()
                times.append(time.perf_counter() - t)
            out["p2p"][n] = times[1:]
        # The engine's own CPU per Post and per Wait (outside kernel calls), all ranks at once, with
        # tiny messages and with large ones (a Wait's CPU grows with the bytes it lands), and the
        # transport's CPU per byte of its messages (the copy rate).
        out["engine_exchange"] = {c: _exchanges(rank, world, repeat, c) for c in (CALL_LEN, LAND_CHUNK)}
    dist.barrier()
    return out


def _ranks(samples: Sequence[Sequence[Dict]]) -> list:
    """Every rank's measurements of every sample, one list (for medians over ranks and samples)."""
    return [r for sample in samples for r in sample]


def copy_rate(samples: Sequence[Sequence[Dict]]) -> float:
    """Bytes per CPU second that one end of a message spends on it (the sender copying it out, the
    receiver in): the CPU of the transport's threads (gloo's, not the ranks' own) over the bytes
    each rank sent and received, on the engine's own path (``_exchanges`` with large messages, the
    ranks computing meanwhile, as in the runs the simulator predicts); median over ranks, samples
    and repeats; 0 when not measured (one rank). Messages sent back to back with nothing else running
    cost less CPU per byte (at world 4 here: 5.4-5.7 GB/s, against 3.6-3.7 on the engine's path).

    >>> copy_rate([[{"engine_exchange": {LAND_CHUNK: ([], [], [2e9, 1e9, 3e9])}}]])
    2000000000.0
    """
    got = [r.get("engine_exchange") for r in _ranks(samples)]
    if not all(got) or any(len(g[LAND_CHUNK]) < 3 for g in got):
        return 0.0
    return statistics.median([x for g in got for x in g[LAND_CHUNK][2]])


def p2p_round_s(samples: Sequence[Sequence[Dict]], n: int) -> float:
    """Median over rounds (of every sample) of the slowest rank's time to exchange ``n`` bytes
    (calibrate: ``measure``).

    >>> p2p_round_s([[{"p2p": {8: [1.0, 5.0, 2.0]}}, {"p2p": {8: [3.0, 1.0, 1.0]}}]], 8)
    3.0
    """
    return statistics.median([max(r["p2p"][n][i] for r in res) for res in samples
                              for i in range(len(res[0]["p2p"][n]))])


def host_cores(samples: Sequence[Sequence[Dict]]) -> float:
    """The cores the ranks share: the affinity mask's, or the compute the host delivered to them all
    at once if less. Per round of ``sharing_sample``: their single-core seconds over the time until
    the last is done; the median over every round of every sample (the validation takes samples
    before, during and after its timed runs, so that one slow minute of the machine is outvoted).
    Below the core count when ranks that outnumber the cores thrash each other's caches at every
    switch, or when ranks on their own cores contend for caches and memory.

    >>> host_cores([[{"cores": 2, "sharing": (1.0, [2.2, 2.0, 9.0])}] * 4])  # 4 s of work in 2.2 s
    1.818182
    >>> host_cores([[{"cores": 2, "sharing": (1.0, r)}] * 4 for r in ([9.0, 9.0], [2.0, 2.2], [2.2, 2.0])])
    1.818182
    >>> host_cores([[{"cores": 2, "sharing": None}] * 2])
    2.0
    """
    cores = float(min(r["cores"] for r in _ranks(samples)))
    if any(not r.get("sharing") for r in _ranks(samples)):
        return cores
    got = []
    for res in samples:  # one sample: the same rounds on every rank
        work = sum(r["sharing"][0] for r in res)
        got += [work / max(r["sharing"][1][i] for r in res) for i in range(len(res[0]["sharing"][1]))]
    return round(min(cores, statistics.median(got)), 6)


def engine_host(samples: Sequence[Sequence[Dict]]) -> Tuple[float, float, float]:
    """(post seconds, wait seconds, landing bytes per second) of the engine's CPU per Post and per
    Wait (``_exchanges``; medians over ranks, samples and repeats): a Post's from the tiny messages;
    a Wait's fixed part and landing rate through its time with tiny and with large messages (as
    fit_link). Zeros when not measured (one rank: no exchanges).

    >>> small, big = exchange_bytes(CALL_LEN), exchange_bytes(LAND_CHUNK)
    >>> r = {"engine_exchange": {CALL_LEN: ([4e-4], [2e-4 + small / 1e9]), LAND_CHUNK: ([5e-4], [2e-4 + big / 1e9])}}
    >>> post, wait, rate = engine_host([[r, r]])
    >>> round(post * 1e6, 6), round(wait * 1e6, 6), round(rate / 1e9, 6)
    (400.0, 200.0, 1.0)
    """
    got = [r.get("engine_exchange") for r in _ranks(samples)]
    if not all(got):
        return 0.0, 0.0, 0.0

    def med(chunk, i):
        return statistics.median([x for g in got for x in g[chunk][i]])
    sizes = [exchange_bytes(c) for c in (CALL_LEN, LAND_CHUNK)]
    rate, fixed = fit_link(sizes, [med(CALL_LEN, 1), med(LAND_CHUNK, 1)])
    return med(CALL_LEN, 0), fixed, rate


def profile_from(samples: Sequence[Sequence[Dict]], world: int, gpus_per_node: int = 0,
                 name: str = "") -> CpuProfile:
    """The profile and its host (spec/host.py) from every rank's ``measure`` (``samples[k][r]``: rank
    r's of sample k; the validation takes one before, one mid-way through and one after its timed runs):
    single-core rates, the links measured with every rank running, and the host's cores that the ranks
    share. The ranks measured compute one at a time, so theirs are repeats of one measurement: the
    median over ranks and samples is kept, of each one's own difference where a fixed cost is taken out
    (the maxima of two noisy figures, differenced, once made a 16-token block look 10x faster than a
    32-token one). One sample is a moment of this shared machine: within one run the same table point
    measured 1.4-1.9 ms on the 4 ranks in turn, and the sample's median moved the simulated time of a
    ring plan by up to 12% from sample to sample; one sample of the host's cores alone once gave 1.29
    where the other runs gave 1.77-1.84 (every plan of that run simulated 15-54% too slow)."""
    from megatron_zeppelin.planner.cost.cost_model import BWD_FLOPS
    m = CPU_MODEL
    every = _ranks(samples)

    def med(f):
        return statistics.median([f(r) for r in every])

    def seq(r, b):  # the engine path's fixed cost per sequence (a query chunk with its key blocks)
        return r["engine_seq"][b]

    def call(r, b):  # the engine's fixed cost per kernel call
        return r["engine_call"][b]

    def full_block(r, d, b, L):  # one full block's FLOPs time: the full probe's call less its fixed costs
        n = r["full_blocks"][L]  # each block its own sequence
        return (r["full_" + d][L] * n - call(r, b) - n * seq(r, b)) / n

    def causal(r, d, b, L):  # one causal block's FLOPs time: a local document less its fixed costs
        n = r["local_docs"][L]  # one sequence each
        per_doc = (r["local_" + d][L] - call(r, b)) / n - seq(r, b)
        # A difference of timings: noise (one repeat, a busy moment) can leave it at or below zero.
        # A causal block does at least half a full block's work, so it is held to that.
        return max(per_doc, full_block(r, d, b, L) / 2)
    # The rates: FLOPs over a block's time on the engine's path less its fixed part there (per
    # sequence, per call). The profile's fixed costs are the engine's too: each sequence of a call
    # costs its blocks' FLOPs at the rate plus the per-sequence cost, each kernel call (one per rank
    # per Compute) the per-call cost.
    rates = {}
    for key in ("", "full_"):
        out = []
        for b, d in enumerate(("fwd", "bwd")):
            sec = (lambda r, L: full_block(r, d, b, L)) if key else (lambda r, L: causal(r, d, b, L))
            ys = []
            for L in SEQLENS:  # the rate of the FLOPs once the fixed costs are taken out
                # the probe's FLOPs per block (its documents' lengths spread around L), as the cost model counts them
                fl = med(lambda r: r["full_flops" if key else "local_flops"][L]) * (BWD_FLOPS if b else 1.0)
                whole = med(lambda r: r["full_" + d][L])  # a full block's time with its fixed share
                ys.append(fl / max(med(lambda r: sec(r, L)), 0.05 * whole) / 1e12)
            out.append(tuple(ys))
        rates[key] = tuple(out)
    call_f, call_b = (med(lambda r: call(r, b)) for b in (0, 1))
    seq_f, seq_b = (med(lambda r: seq(r, b)) for b in (0, 1))
    gemm = 2.0 * 1024 * m.hidden * m.ffn / med(lambda r: r["gemm"]) / 1e12
    if world > 1:
        bw, lat = fit_link(SIZES, [p2p_round_s(samples, n) for n in SIZES])
    else:  # nothing to measure: a figure that never matters (no messages with one rank)
        bw, lat = 1e9, 0.0
    gpn = gpus_per_node or (world // 2 if world >= 4 else world)  # world 4: 2 virtual nodes of 2
    post, wait, land = engine_host(samples)
    host = HostModel(cores=host_cores(samples), copy_GBps=copy_rate(samples) / 1e9 if world > 1 else 0.0,
                     post_us=post * 1e6, wait_us=wait * 1e6, land_GBps=land / 1e9,
                     pack_GBps=1e-9 / med(lambda r: r["pack"]))
    profile = HardwareProfile(
        name=name or f"cpu-w{world}", gpu="cpu (gloo, 1 thread per rank)", gemm_tflops=gemm,
        attn_seqlen=SEQLENS, attn_fwd_tflops=rates[""][0], attn_bwd_tflops=rates[""][1],
        attn_full_fwd_tflops=rates["full_"][0], attn_full_bwd_tflops=rates["full_"][1],
        nvlink_GBps=bw / 1e9, nvlink_latency_us=lat * 1e6, nic_GBps=bw / 1e9, nic_latency_us=lat * 1e6,
        gpus_per_node=gpn, nics_per_node=gpn, memory_GB=0.0,
        attn_call_fwd_us=call_f * 1e6, attn_call_bwd_us=call_b * 1e6,
        attn_seq_fwd_us=seq_f * 1e6, attn_seq_bwd_us=seq_b * 1e6,
        assumed=("measured on this machine by `zeppelin bench --validate-cpu`: compute rates with one rank "
                 f"computing at a time (single core), median over ranks and {len(samples)} sample(s); host.cores = what the {world} ranks got computing at "
                 f"once, at most the {min(r['cores'] for r in every)} cores of the affinity mask; links and "
                 f"the copy rate and the engine's CPU per Post / Wait with {world} ranks exchanging at once "
                 "(median round; per Post / Wait the mean over a pass, median over passes); packing own rows on one "
                 "core; nvlink and nic are the "
                 "same gloo transport",))
    return CpuProfile(profile, with_splits(samples, profile, host))


def fit_split(n: Sequence[float], rows: Sequence[float], extra: Sequence[float]) -> Tuple[float, float]:
    """(seconds per split sequence, per query row) from probes of ``n`` split sequences of ``rows``
    rows in all that took ``extra`` seconds more than the model without them: least squares through
    the per-sequence figures against rows per sequence, neither part below 0.

    >>> [round(x * 1e6, 6) for x in fit_split([10, 10], [160, 640], [10 * 40e-6, 10 * 64e-6])]
    [32.0, 0.5]
    >>> [round(x * 1e6, 6) for x in fit_split([10, 10], [160, 640], [-1e-4, -2e-4])]
    [0.0, 0.0]
    """
    import numpy as np
    x = np.asarray(rows, dtype=np.float64) / np.asarray(n, dtype=np.float64)
    y = np.asarray(extra, dtype=np.float64) / np.asarray(n, dtype=np.float64)
    row, fixed = np.polyfit(x, y, 1) if len(x) > 1 and np.ptp(x) > 0 else (0.0, float(np.mean(y)))
    if row < 0:  # noise, or a model already high for long chunks: no part per row
        row, fixed = 0.0, float(np.mean(y))
    if fixed < 0:
        row, fixed = max(0.0, float(np.sum(x * y) / np.sum(x * x))), 0.0
    return float(fixed), float(row)


def probe_price(p: HardwareProfile, chunks: Sequence[int], member: int, step: int,
                host: Optional[HostModel] = None) -> Tuple[float, float]:
    """(forward, backward) seconds the model prices a block probe at (``_probe`` over ``chunks``:
    ``member`` at ring ``step`` of ``probe_ring``), by the layer program's own pricing
    (program.ring_step_costs: the tables, the fixed costs per call and per sequence, and with a
    ``host`` its cost per split sequence)."""
    from megatron_zeppelin.planner.cost.cost_model import CostModel
    from megatron_zeppelin.planner.program import ring_step_costs
    from megatron_zeppelin.spec.topology import Topology
    docs, ring = probe_ring(chunks)
    fwd, bwd = ring_step_costs(CostModel(CPU_MODEL, p, Topology(1, 2, 2), host=host), [ring],
                               {x.doc: x for x in docs}, 2, 2)
    return float(fwd[step, member]), float(bwd[step, member])


def with_splits(samples: Sequence[Sequence[Dict]], p: HardwareProfile, host: HostModel) -> HostModel:
    """``host`` with the extra of a split sequence (split_*: a query chunk with full keys then its
    causal run, which the CPU kernel runs as two sequences and a merge): the own-block probes
    (``_compute``: ring step 0 of a ring of 2, SPLIT_LENS-token chunks) measured on the engine's path,
    less what the model without that term prices the same blocks at (program.ring_step_costs: the
    tables of ``p``, the fixed costs per call and per sequence), median over ranks and samples.
    Unchanged where the samples have no such probe."""
    from dataclasses import replace
    every = _ranks(samples)
    if not all("own_fwd" in r for r in every):
        return host
    got = {}
    for b, d in enumerate(("fwd", "bwd")):
        n, rows, extra = [], [], []
        for L in SPLIT_LENS:
            chunks = spread_lengths(L, _probe_docs(L))
            model = probe_price(p, chunks, 0, 0)[b]  # member 0, step 0: its own block
            n.append(len(chunks))
            rows.append(sum(chunks))
            extra.append(statistics.median([r["own_" + d][L] for r in every]) - model)
        got[d] = fit_split(n, rows, extra)
    return replace(host, split_fwd_us=got["fwd"][0] * 1e6, split_row_fwd_us=got["fwd"][1] * 1e6,
                   split_bwd_us=got["bwd"][0] * 1e6, split_row_bwd_us=got["bwd"][1] * 1e6)


def calibrate(world: int, repeat: int = 5, gpus_per_node: int = 0, name: str = "") -> CpuProfile:
    from megatron_zeppelin.distributed.launch import run_distributed
    return profile_from([run_distributed(measure, world, repeat, timeout=600)], world, gpus_per_node, name)
