"""Topology discovery: nodes and GPUs from SLURM/torchrun, NICs and the GPU->NIC map from the system.

The GPU->NIC map comes from ``nvidia-smi topo -m``: each GPU is wired to the NIC it reaches through
the fewest PCIe hops (PIX < PXB < PHB < NODE < SYS). NICs that are no GPU's closest (management or
storage ports) are not compute NICs and are dropped; ``NCCL_IB_HCA`` narrows the list further.
When flags are given too they must agree with what the system says, else the error names the flag.

>>> text = '''
...         GPU0    GPU1    GPU2    GPU3    NIC0    NIC1    NIC2    CPU Affinity
... GPU0     X      NV4     NV4     NV4     PIX     SYS     SYS     0-31
... GPU1    NV4      X      NV4     NV4     PXB     SYS     SYS     0-31
... GPU2    NV4     NV4      X      NV4     SYS     PIX     SYS     32-63
... GPU3    NV4     NV4     NV4      X      SYS     PXB     SYS     32-63
... NIC0    PIX     PXB     SYS     SYS      X      SYS     SYS
...
... NIC Legend:
...
...   NIC0: mlx5_0
...   NIC1: mlx5_1
...   NIC2: mlx5_bond_0
... '''
>>> parse_nvidia_smi_topo(text)
NicMap(gpus=4, nic_names=('mlx5_0', 'mlx5_1'), gpu_to_nic=(0, 0, 1, 1))
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Tuple

from megatron_zeppelin.spec.topology import Topology, TopologyError

_RANK = {"X": -1, "PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SOC": 4, "SYS": 4}


@dataclass(frozen=True)
class NicMap:
    gpus: int
    nic_names: Tuple[str, ...]
    gpu_to_nic: Tuple[int, ...]


def parse_nvidia_smi_topo(text: str, hca_filter: Optional[Sequence[str]] = None) -> NicMap:
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    header = next((ln for ln in lines if re.match(r"^\s+GPU0\b", ln)), None)
    if header is None:
        raise TopologyError("cannot read `nvidia-smi topo -m` output (no GPU0 header): "
                            "pass --zeppelin-gpu-nic-map and --zeppelin-nics-per-node")
    cols = re.findall(r"\S+", header.split("CPU")[0])
    legend = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)", text, flags=re.M))
    nic_cols = [i for i, c in enumerate(cols) if not c.startswith("GPU")]
    names = [legend.get(cols[i], cols[i]) for i in nic_cols]
    rows = [ln for ln in lines if re.match(r"^GPU\d+\s", ln)]
    closest = []
    for ln in rows:
        cells = re.findall(r"\S+", ln)[1:1 + len(cols)]
        best = None
        for k, i in enumerate(nic_cols):
            if hca_filter and not any(names[k].startswith(h) for h in hca_filter):
                continue
            r = _RANK.get(cells[i], 9)
            if best is None or r < best[0]:
                best = (r, k)
        if best is None:
            raise TopologyError("no NIC found in `nvidia-smi topo -m` (check NCCL_IB_HCA)")
        closest.append(best[1])
    used = sorted(set(closest))
    return NicMap(len(rows), tuple(names[k] for k in used), tuple(used.index(k) for k in closest))


def read_nvidia_smi_topo() -> Optional[str]:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def discover_topology(env: Optional[Mapping[str, str]] = None, *, nodes: int = 0, gpus_per_node: int = 0,
                      nics_per_node: int = 0, gpu_nic_map: Sequence[int] = (),
                      topo_text: Optional[str] = None, probe: bool = True) -> Topology:
    """Flags win where the system says nothing; where both speak they must agree."""
    import os

    env = os.environ if env is None else env
    try:
        base = Topology.from_env(env)
    except TopologyError:
        if not (nodes and gpus_per_node):
            raise
        base = Topology(nodes, gpus_per_node)
    if nodes and nodes != base.nodes:
        raise TopologyError(f"--nodes {nodes} contradicts the job environment ({base.nodes} nodes)")
    if gpus_per_node and gpus_per_node != base.gpus_per_node:
        raise TopologyError(f"--zeppelin-gpus-per-node {gpus_per_node} contradicts the job environment "
                            f"({base.gpus_per_node} ranks per node)")
    if topo_text is None and probe:
        topo_text = read_nvidia_smi_topo()
    nic_map = None
    if topo_text:
        hca = [h.lstrip("^=").split(":")[0] for h in env.get("NCCL_IB_HCA", "").split(",") if h.strip()]
        nic_map = parse_nvidia_smi_topo(topo_text, hca or None)
        if nic_map.gpus != base.gpus_per_node:
            raise TopologyError(f"nvidia-smi shows {nic_map.gpus} GPUs per node but the job runs "
                                f"{base.gpus_per_node} ranks per node (fix --ntasks-per-node)")
        if nics_per_node and nics_per_node != len(nic_map.nic_names):
            raise TopologyError(f"--zeppelin-nics-per-node {nics_per_node} contradicts the system "
                                f"({len(nic_map.nic_names)} compute NICs: {', '.join(nic_map.nic_names)})")
        if gpu_nic_map and tuple(gpu_nic_map) != nic_map.gpu_to_nic:
            raise TopologyError(f"--zeppelin-gpu-nic-map {list(gpu_nic_map)} contradicts the system "
                                f"({list(nic_map.gpu_to_nic)} from nvidia-smi topo -m)")
        return Topology(base.nodes, base.gpus_per_node, len(nic_map.nic_names), nic_map.gpu_to_nic)
    return Topology(base.nodes, base.gpus_per_node, nics_per_node, tuple(gpu_nic_map))
