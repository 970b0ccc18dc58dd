"""Turn measurements into a HardwareProfile; fields not measured are copied from a base profile
and listed in ``assumed`` (so a reader knows which numbers are this machine's)."""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional

from megatron_zeppelin.spec.hardware import HardwareProfile


def _sig(x: float) -> float:
    return float(f"{x:.6g}")  # 6 significant digits: CPU rates are ~1e-4 TFLOP/s


def build_profile(name: str, gpu: str, attention: List[Dict], gemm: Dict, intra: Optional[Dict],
                  inter: Optional[Dict], base: HardwareProfile, gpus_per_node: int, nics_per_node: int,
                  memory_GB: float) -> HardwareProfile:
    assumed = []
    nv = intra or {}
    nic = inter or intra or {}
    if not intra:
        assumed.append("nvlink (from base profile %s)" % base.name)
    if not inter:
        assumed.append("nic (%s)" % ("= intra-node measurement" if intra else "from base profile %s" % base.name))
    # The base's kernel terms (full-block tables, pricing by sequence, tile, launch cost) and its
    # assumed NCCL terms (per-message overhead, SM contention) describe its GPUs, not this machine:
    # a measured link latency already holds its per-message cost.
    return replace(
        base, name=name, gpu=gpu, gemm_tflops=_sig(gemm["tflops"]),
        attn_full_fwd_tflops=(), attn_full_bwd_tflops=(), attn_by_sequence=False, attn_tile_tokens=0,
        attn_call_fwd_us=0.0, attn_call_bwd_us=0.0, attn_seq_fwd_us=0.0, attn_seq_bwd_us=0.0,
        message_us=0.0, overlap_slowdown=0.0,
        attn_seqlen=tuple(a["seqlen"] for a in attention),
        attn_fwd_tflops=tuple(_sig(a["fwd_tflops"]) for a in attention),
        attn_bwd_tflops=tuple(_sig(a["bwd_tflops"]) for a in attention),
        nvlink_GBps=_sig(nv.get("GBps", base.nvlink_GBps)),
        nvlink_latency_us=_sig(nv.get("latency_us", base.nvlink_latency_us)),
        nic_GBps=_sig(nic.get("GBps", base.nic_GBps)),
        nic_latency_us=_sig(nic.get("latency_us", base.nic_latency_us)),
        gpus_per_node=gpus_per_node, nics_per_node=nics_per_node,
        gpu_to_nic=tuple(min(g * nics_per_node // gpus_per_node, nics_per_node - 1) for g in range(gpus_per_node)),
        memory_GB=memory_GB, assumed=tuple(assumed))
