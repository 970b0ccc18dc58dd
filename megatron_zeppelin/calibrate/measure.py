"""Measure one machine into a HardwareProfile: attention by length, GEMM rate, links.

Used by ``zeppelin calibrate`` and by ``zeppelin demo --cluster auto`` (the demo plans with this
machine's own costs, so its classes and rings are the ones that pay here).
"""

from __future__ import annotations

import os
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

from megatron_zeppelin.spec.model import ModelSpec
from megatron_zeppelin.spec.hardware import HardwareProfile, load_profile
from megatron_zeppelin.calibrate.compute import attention_rates, gemm_rate
from megatron_zeppelin.calibrate.noise import gemm_warning, settle
from megatron_zeppelin.calibrate.links import cpu_link, ping_pong
from megatron_zeppelin.calibrate.profile_builder import build_profile


def measure_profile(model: ModelSpec, device: str = "cpu", tp: int = 1, lengths: Optional[Sequence[int]] = None,
                    repeats: int = 5, gpus_per_node: int = 0, nics_per_node: int = 0, base: str = "h200",
                    name: str = "", log: Callable[[str], None] = print,
                    retries: int = 2) -> Tuple[HardwareProfile, Dict]:
    """(profile, measurements); ``measurements["warnings"]`` lists what stayed noisy after ``retries``
    rounds of measuring again (calibrate/noise.py)."""
    cuda = device == "cuda"
    heads, kvh = max(1, model.heads // tp), max(1, model.kv_heads // tp)
    lengths = list(lengths or ([512, 1024, 2048, 4096, 8192, 16384] if cuda else [128, 256, 512, 1024, 2048, 4096]))
    dtype = torch.bfloat16 if cuda else torch.float32
    log(f"[calibrate] attention: {model.name} ({heads} heads, {kvh} KV heads, head dim {model.head_dim}), "
        f"{dtype}, lengths {lengths}")
    att = attention_rates(lengths, heads, kvh, model.head_dim, device, dtype, repeats)
    # A busy machine shows as repeats that disagree or rates that fall with length: measure those again
    # (more repeats), keep each length's fastest, and say what is still noisy.
    att, warnings = settle(att, lambda ls: attention_rates(ls, heads, kvh, model.head_dim, device, dtype, 2 * repeats),
                           retries, log)
    for a in att:
        log(f"  L={a['seqlen']:>6}: fwd {a['fwd_tflops'] * 1e3:9.3f} GFLOP/s  bwd {a['bwd_tflops'] * 1e3:9.3f} GFLOP/s"
            f"  (repeats within {a['fwd_spread']:.2f}x / {a['bwd_spread']:.2f}x)")
    toks = 4096  # large enough that one GEMM is not lost in timer noise
    shapes = [(toks, model.ffn // tp, model.hidden), (toks, model.hidden, model.ffn // tp),
              (toks, (model.heads + 2 * model.kv_heads) * model.head_dim // tp, model.hidden)]
    gemm = gemm_rate(shapes, device, dtype, repeats)
    if gemm_warning(gemm):
        log(f"[calibrate] noisy GEMM timings ({gemm_warning(gemm)[0]}), measuring again")
        gemm = max(gemm, gemm_rate(shapes, device, dtype, 2 * repeats), key=lambda g: g["tflops"])
    warnings += gemm_warning(gemm)
    log(f"[calibrate] GEMM: {gemm['tflops'] * 1e3:.2f} GFLOP/s at {gemm['shape']}")
    intra = inter = None
    if cuda:
        import torch.distributed as dist
        if int(os.environ.get("WORLD_SIZE", "1")) >= 2:
            if not dist.is_initialized():
                dist.init_process_group("nccl")
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            sizes = [1 << 12, 1 << 26]
            intra = ping_pong(0, 1, sizes, "cuda") if local >= 2 else None
            if dist.get_world_size() > local:
                inter = ping_pong(0, local, sizes, "cuda")
        else:
            log("[calibrate] one process: links not measured (launch with torchrun on >= 2 GPUs)")
    else:
        intra = cpu_link()
        log(f"[calibrate] gloo: {intra['GBps']:.3f} GB/s, latency {intra['latency_us']:.1f} us")
    gpn = gpus_per_node or (torch.cuda.device_count() if cuda else 2)
    memory = (torch.cuda.get_device_properties(0).total_memory if cuda
              else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / 1e9
    prof = build_profile(name or f"local-{device}", torch.cuda.get_device_name() if cuda else "cpu (gloo)", att, gemm,
                         intra, inter if cuda else None, load_profile(base), gpn, nics_per_node or gpn, memory)
    return prof, {"attention": att, "gemm": gemm, "intra": intra, "inter": inter, "model": model.name, "tp": tp,
                  "dtype": str(dtype), "warnings": warnings}
