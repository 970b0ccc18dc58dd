"""The data-parallel gradient all-reduce: the same for every strategy (it depends on the model and
the domain, not on the plan).

NCCL's ring all-reduce moves 2(W-1)/W of the gradient through every rank. Inside a node the ring
runs on NVLink; across nodes each channel crosses a node boundary on one NIC and NCCL runs one
channel per NIC, so the bus bandwidth is min(NVLink, NICs per node x NIC bandwidth).
Gradients are reduced in fp32 (Megatron's default for bf16 training: 4 bytes per parameter).

Megatron DDP either all-reduces after the whole backward (``--overlap-grad-reduce`` off, its
default) or per bucket as the backward finishes each layer (on): ``exposed_s`` models both with one
bucket per layer, buckets reduced one after the other.

>>> from megatron_zeppelin.topology import Topology
>>> allreduce_s(8e9, Topology(2, 8, 4), nvlink_Bps=155e9, nic_Bps=22e9, nvlink_lat=0.0, nic_lat=0.0)  # 2*15/16*8e9 / 88e9
0.17045454545454544
>>> exposed_s(1.0, layer_ends=[1.0, 2.0, 3.0], backward_end=3.0, overlap=True)  # 3 buckets of 1/3 s
0.3333333333333335
"""

from __future__ import annotations

from typing import Sequence

from ..topology import Topology


def allreduce_s(nbytes: float, topo: Topology, nvlink_Bps: float, nic_Bps: float,
                nvlink_lat: float, nic_lat: float) -> float:
    w = topo.world_size
    if w <= 1 or nbytes <= 0:
        return 0.0
    if topo.nodes == 1:
        bw, lat = nvlink_Bps, nvlink_lat
    else:
        bw, lat = min(nvlink_Bps, topo.nics_per_node * nic_Bps), nic_lat
    return 2 * (w - 1) * lat + 2 * (w - 1) / w * nbytes / bw


def exposed_s(total_s: float, layer_ends: Sequence[float], backward_end: float, overlap: bool) -> float:
    """Seconds the all-reduce adds after the backward. ``layer_ends``: when the backward finished
    each layer (in backward order); without overlap the whole all-reduce follows the backward."""
    if not overlap or not layer_ends:
        return total_s
    per = total_s / len(layer_ends)
    t = 0.0
    for e in layer_ends:
        t = max(t, e) + per
    return max(0.0, t - backward_end)
