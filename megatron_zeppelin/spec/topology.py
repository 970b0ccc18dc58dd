"""Topology of one Zeppelin domain: nodes x GPUs, and which NIC each GPU is wired to.

Rank r of the domain sits on node ``r // gpus_per_node`` at local index ``r % gpus_per_node``.
NIC k of a node serves the local GPUs whose ``gpu_to_nic`` entry is k; NIC ids are global:
``node * nics_per_node + k``. A *rail* is the set of same-index NICs across nodes.

Example (2 nodes x 4 GPUs, 2 NICs per node, GPUs 0,1 on NIC 0 and 2,3 on NIC 1):

>>> t = Topology(nodes=2, gpus_per_node=4, nics_per_node=2)
>>> t.world_size, t.node_of(5), t.local_of(5), t.nic_of(5)
(8, 1, 1, 2)
>>> t.gpu_to_nic
(0, 0, 1, 1)
>>> t.node_ranks(1)
(4, 5, 6, 7)
>>> t.rail_ranks(0)
(0, 4)

Levels: ranks of one node are joined by NVLink (level 0); network levels join groups of
consecutive nodes, innermost first (the profile's ``spans``: nodes per group, 0 = all). With a
leaf switch per 2 nodes under a spine, ranks 0 and 5 of 4 nodes x 2 GPUs meet at the spine:

>>> t4 = Topology(4, 2)
>>> t4.level_of(0, 1, (2, 0)), t4.level_of(0, 3, (2, 0)), t4.level_of(0, 5, (2, 0)), t4.level_of(0, 5, (0,))
(0, 1, 2, 1)
>>> link_ports("spine", 0, 5, 0, t4)   # a network hop uses its NICs, and above the NIC level its level's ports
(('nic_out', 0), ('nic_in', 5), ('spine_out', 0), ('spine_in', 5))
"""

from __future__ import annotations

from megatron_zeppelin.errors import ZeppelinError

import os
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence, Tuple

from megatron_zeppelin.spec.words import Link


class TopologyError(ZeppelinError):
    """A topology that cannot exist; the message names the flag to change."""


@dataclass(frozen=True)
class Topology:
    nodes: int
    gpus_per_node: int
    nics_per_node: int = 0  # 0 = one NIC per GPU
    gpu_to_nic: Tuple[int, ...] = field(default=())

    def __post_init__(self):
        if self.nodes < 1:
            raise TopologyError(f"nodes must be >= 1, got {self.nodes} (set --nodes / --zeppelin-nodes)")
        if self.gpus_per_node < 1:
            raise TopologyError(
                f"gpus_per_node must be >= 1, got {self.gpus_per_node} (set --zeppelin-gpus-per-node)")
        nics = self.nics_per_node or self.gpus_per_node
        object.__setattr__(self, "nics_per_node", nics)
        if not self.gpu_to_nic:
            # Default wiring: GPUs evenly shared by consecutive NICs (PCIe-switch pairs).
            per = max(1, self.gpus_per_node // nics)
            object.__setattr__(
                self, "gpu_to_nic", tuple(min(g // per, nics - 1) for g in range(self.gpus_per_node)))
        m = tuple(int(x) for x in self.gpu_to_nic)
        object.__setattr__(self, "gpu_to_nic", m)
        if len(m) != self.gpus_per_node:
            raise TopologyError(
                f"gpu->nic map has {len(m)} entries for {self.gpus_per_node} GPUs per node "
                "(fix --zeppelin-gpu-nic-map)")
        if any(k < 0 or k >= nics for k in m):
            raise TopologyError(
                f"gpu->nic map {m} names a NIC outside 0..{nics - 1} (fix --zeppelin-gpu-nic-map "
                "or --zeppelin-nics-per-node)")

    # --- rank arithmetic -------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def num_nics(self) -> int:
        return self.nodes * self.nics_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def local_of(self, rank: int) -> int:
        return rank % self.gpus_per_node

    def nic_of(self, rank: int) -> int:
        """Global id of the NIC wired to ``rank``."""
        return self.node_of(rank) * self.nics_per_node + self.gpu_to_nic[self.local_of(rank)]

    def node_ranks(self, node: int) -> Tuple[int, ...]:
        g = self.gpus_per_node
        return tuple(range(node * g, (node + 1) * g))

    def rail_ranks(self, local: int) -> Tuple[int, ...]:
        return tuple(n * self.gpus_per_node + local for n in range(self.nodes))

    def nic_ranks(self, nic: int) -> Tuple[int, ...]:
        """Ranks wired to global NIC ``nic``."""
        node, k = divmod(nic, self.nics_per_node)
        return tuple(r for r in self.node_ranks(node) if self.gpu_to_nic[self.local_of(r)] == k)

    def same_node(self, a: int, b: int) -> bool:
        return self.node_of(a) == self.node_of(b)

    def level_of(self, a: int, b: int, spans: Sequence[int]) -> int:
        """The level joining ranks ``a`` and ``b``: 0 inside a node, else 1 + the index of the first
        network level whose group (``spans[i]`` consecutive nodes, 0 = all) holds both nodes."""
        na, nb = self.node_of(a), self.node_of(b)
        if na == nb:
            return 0
        for i, span in enumerate(spans):
            if span == 0 or na // span == nb // span:
                return i + 1
        raise TopologyError(f"no cluster level joins nodes {na} and {nb}: the profile's top level joins "
                            f"{spans[-1]} nodes but the domain has {self.nodes} (give the top level nodes: 0)")

    def describe(self) -> str:
        return (f"{self.nodes} node(s) x {self.gpus_per_node} GPU(s), {self.nics_per_node} NIC(s)/node, "
                f"gpu->nic {list(self.gpu_to_nic)}")

    def to_dict(self) -> dict:
        return {"nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "nics_per_node": self.nics_per_node, "gpu_to_nic": list(self.gpu_to_nic)}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Topology":
        return cls(int(d["nodes"]), int(d["gpus_per_node"]), int(d.get("nics_per_node", 0)),
                   tuple(d.get("gpu_to_nic", ())))

    @classmethod
    def from_world(cls, world_size: int, gpus_per_node: int, nics_per_node: int = 0,
                   gpu_to_nic: Tuple[int, ...] = ()) -> "Topology":
        if gpus_per_node < 1 or world_size % gpus_per_node:
            raise TopologyError(
                f"world size {world_size} does not divide into nodes of {gpus_per_node} GPUs "
                "(set --zeppelin-gpus-per-node to a divisor of the domain size)")
        return cls(world_size // gpus_per_node, gpus_per_node, nics_per_node, tuple(gpu_to_nic))

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None, nics_per_node: int = 0,
                 gpu_to_nic: Tuple[int, ...] = ()) -> "Topology":
        """Nodes and GPUs per node from torchrun (WORLD_SIZE, LOCAL_WORLD_SIZE) or SLURM
        (SLURM_NNODES, SLURM_NTASKS_PER_NODE / SLURM_GPUS_ON_NODE)."""
        env = os.environ if env is None else env
        if "WORLD_SIZE" in env and "LOCAL_WORLD_SIZE" in env:
            return cls.from_world(int(env["WORLD_SIZE"]), int(env["LOCAL_WORLD_SIZE"]),
                                  nics_per_node, gpu_to_nic)
        if "SLURM_NNODES" in env:
            nodes = int(env["SLURM_NNODES"])
            per = env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_GPUS_ON_NODE")
            if per is None and "SLURM_NTASKS" in env:
                ntasks = int(env["SLURM_NTASKS"])
                if ntasks % nodes:
                    raise TopologyError(f"SLURM_NTASKS={ntasks} is not a multiple of SLURM_NNODES={nodes}")
                per = str(ntasks // nodes)
            if per is None:
                raise TopologyError("SLURM job without SLURM_NTASKS_PER_NODE or SLURM_GPUS_ON_NODE: "
                                    "pass --zeppelin-gpus-per-node")
            per = int(str(per).split("(")[0].split(",")[0])
            return cls(nodes, per, nics_per_node, tuple(gpu_to_nic))
        raise TopologyError("no torchrun or SLURM environment found: pass --nodes and --zeppelin-gpus-per-node")


def link_ports(link: str, src: int, dst: int, nic: int, topo: Topology) -> Tuple[Tuple[str, int], ...]:
    """The ports a message on link class ``link`` loads (the prediction and the simulator share
    them): NVLink, the GPUs' out- and in-ports; a network hop leaves on NIC ``nic`` (the sender's
    if < 0) and arrives on the NIC wired to ``dst``; above the NIC level it also loads that level's
    port of both NICs (their share of the level's links, the profile's per-NIC bandwidth)."""
    if link == Link.NVLINK:
        return ("nv_out", src), ("nv_in", dst)
    out, into = nic if nic >= 0 else topo.nic_of(src), topo.nic_of(dst)
    ports = (("nic_out", out), ("nic_in", into))
    return ports if link == Link.NIC else ports + ((f"{link}_out", out), (f"{link}_in", into))
