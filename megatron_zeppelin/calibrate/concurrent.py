"""Calibrate a HardwareProfile on this CPU with gloo, every rank measuring at once, as the
simulator's validation needs it (``zeppelin calibrate`` measures one process, on any device):
attention rate by length, GEMM rate, and the point-to-point bandwidth and latency between ranks.

Every measurement runs on all ``world`` ranks at once (spawned, one thread each), so the profile
carries the contention of that many ranks sharing the machine's cores and memory: a profile is
calibrated for the world size it will predict. All ranks are on one host, so "NVLink" and "NIC" are
the same gloo transport; the profile's topology splits the ranks into virtual nodes only so that
inter-node rings and routing get exercised.

Timings are the minimum over repeats (other processes on the machine only ever add time). The link
model latency + bytes / bandwidth goes through the smallest and the largest message (the middle
sizes are reported, not fitted: least squares let one noisy point swing the latency by milliseconds).

>>> bw, lat = fit_link([1000, 3000], [2e-6 + 1000 / 1e9, 2e-6 + 3000 / 1e9])
>>> round(bw), round(lat * 1e6, 6)
(1000000000, 2.0)
"""

from __future__ import annotations

from typing import Dict, Sequence, Tuple

from ..model_spec import ModelSpec
from ..profile import HardwareProfile
from .timing import best_seconds

# The model the CPU validation runs (float32, head_dim 32, GQA 8/4).
CPU_MODEL = ModelSpec(name="cpu-validation", layers=1, hidden=256, heads=8, kv_heads=4, ffn=512, vocab=256,
                      dtype_bytes=4)
SEQLENS = (32, 64, 128, 256, 512, 1024, 2048)
CALL_LEN = 4  # a block this small measures the fixed cost of one block call
SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22)


def fit_link(nbytes: Sequence[float], seconds: Sequence[float]) -> Tuple[float, float]:
    i = min(range(len(nbytes)), key=lambda k: nbytes[k])
    j = max(range(len(nbytes)), key=lambda k: nbytes[k])
    slope = (seconds[j] - seconds[i]) / (nbytes[j] - nbytes[i])
    if slope <= 0:  # noise swamped the small message: all of the large one's time is transfer
        return nbytes[j] / seconds[j], seconds[i]
    return 1.0 / slope, max(0.0, seconds[i] - nbytes[i] * slope)


def _time(fn, repeat: int) -> float:
    return best_seconds(fn, "cpu", repeat)  # fastest of repeats after a warm-up, as calibrate.timing


def measure(rank: int, world: int, repeat: int) -> Dict:
    """This rank's measurements (all ranks call it at once, inside torch.distributed)."""
    import torch
    import torch.distributed as dist

    from ..attention.kernels import block_backward, block_forward
    from ..attention.merge import merge_into
    m = CPU_MODEL
    g = torch.Generator().manual_seed(rank)
    out: Dict = {"fwd": {}, "bwd": {}}
    dist.barrier()
    scale = m.head_dim ** -0.5
    for L in (CALL_LEN,) + SEQLENS:  # causal diagonal blocks, as the GPU profiles, the engine's way
        q = torch.randn(L, m.heads, m.head_dim, generator=g)
        k = torch.randn(L, m.kv_heads, m.head_dim, generator=g)
        v = torch.randn(L, m.kv_heads, m.head_dim, generator=g)
        o, lse = block_forward(q, k, v, scale, causal_offset=0)
        do = torch.randn_like(o)
        acc_o, acc_l = torch.zeros_like(o), torch.full(lse.shape, float("-inf"))
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        rows = slice(0, L)

        def fwd():  # as attention/blocks.attend: kernel, then merge into the running output
            a, b = block_forward(q[rows], k[rows], v[rows], scale, 0)
            merge_into(acc_o, acc_l, rows, a, b)

        def bwd():  # as attend_backward: kernel, then accumulate the gradients
            gq, gk, gv = block_backward(do[rows], q[rows], k[rows], v[rows], o[rows], lse[rows], scale, 0)
            dq[rows] += gq
            dk[rows] += gk
            dv[rows] += gv
        out["fwd"][L] = _time(fwd, repeat)
        out["bwd"][L] = _time(bwd, repeat)
    x = torch.randn(1024, m.hidden, generator=g)
    w = torch.randn(m.hidden, m.ffn, generator=g)
    out["gemm"] = _time(lambda: x @ w, repeat)
    dist.barrier()
    # Point-to-point: pairs (0,1), (2,3), ... exchange at once (both directions), like a ring step.
    peer = rank ^ 1
    out["p2p"] = {}
    if peer < world:
        for n in SIZES:
            a = torch.zeros(n // 4)
            b = torch.empty(n // 4)

            def xchg():
                reqs = [dist.isend(a, peer), dist.irecv(b, peer)]
                for r in reqs:
                    r.wait()
            out["p2p"][n] = _time(xchg, repeat)
    dist.barrier()
    return out


def profile_from(res: Sequence[Dict], world: int, gpus_per_node: int = 0, name: str = "") -> HardwareProfile:
    """The profile from every rank's ``measure`` (the slowest rank sets each rate: ranks run at once)."""
    from ..planner.cost_model import BWD_FLOPS
    m = CPU_MODEL
    hd = m.heads * m.head_dim
    fwd, bwd = [], []
    call_f = max(r["fwd"][CALL_LEN] for r in res)
    call_b = max(r["bwd"][CALL_LEN] for r in res)
    for L in SEQLENS:  # the rate of the FLOPs once the fixed cost of the call is taken out
        fl = 2.0 * L * (L + 1) * hd
        tf, tb = max(r["fwd"][L] for r in res), max(r["bwd"][L] for r in res)
        fwd.append(fl / max(tf - call_f, 0.05 * tf) / 1e12)
        bwd.append(BWD_FLOPS * fl / max(tb - call_b, 0.05 * tb) / 1e12)
    gemm = 2.0 * 1024 * m.hidden * m.ffn / max(r["gemm"] for r in res) / 1e12
    if world > 1:
        bw, lat = fit_link(SIZES, [max(r["p2p"][n] for r in res if r["p2p"]) for n in SIZES])
    else:  # nothing to measure: a figure that never matters (no messages with one rank)
        bw, lat = 1e9, 0.0
    gpn = gpus_per_node or (world // 2 if world >= 4 else world)  # world 4: 2 virtual nodes of 2
    return HardwareProfile(
        name=name or f"cpu-w{world}", gpu="cpu (gloo, 1 thread per rank)", gemm_tflops=gemm,
        attn_seqlen=SEQLENS, attn_fwd_tflops=tuple(fwd), attn_bwd_tflops=tuple(bwd),
        nvlink_GBps=bw / 1e9, nvlink_latency_us=lat * 1e6, nic_GBps=bw / 1e9, nic_latency_us=lat * 1e6,
        gpus_per_node=gpn, nics_per_node=gpn, memory_GB=0.0,
        attn_call_fwd_us=call_f * 1e6, attn_call_bwd_us=call_b * 1e6,
        assumed=("measured on this machine by `zeppelin bench --validate-cpu`: every figure is a measurement "
                 f"with {world} ranks running at once; nvlink and nic are the same gloo transport",))


def calibrate(world: int, repeat: int = 5, gpus_per_node: int = 0, name: str = "") -> HardwareProfile:
    from ..distributed.launch import run_distributed
    return profile_from(run_distributed(measure, world, repeat, timeout=600), world, gpus_per_node, name)
