"""The machine a ``plan`` / ``simulate`` run models, from the flags: nodes x GPUs, tensor parallelism,
and the Zeppelin domain that results (one domain rank per TP group), with every flag checked up front
(one line naming the flag, before anything is sampled, planned or written).

GPUs are counted as Megatron counts them: ``--nodes 4 --tp 2`` on 8-GPU nodes is 32 GPUs, 16 TP groups
of 2; the planner balances over the 16 groups (4 per node), and each NIC count is divided the same way.

>>> from types import SimpleNamespace as NS
>>> from megatron_zeppelin.spec.hardware import load_profile
>>> from megatron_zeppelin.spec.model import load_model
>>> d = build_domain(NS(nodes=4, tp=2), load_profile("h200"), load_model("llama-7b"))
>>> d.gpus, d.topology.world_size, d.topology.gpus_per_node
(32, 16, 4)
>>> print(d.describe())
32 GPUs = 4 node(s) x 8 GPUs; TP 2 -> 16 domain ranks (4 per node, each a TP group of 2 GPUs), 4 NIC(s) per node for them
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Tuple

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.topology import Topology


class FlagError(ZeppelinError):
    """A flag value that cannot mean anything; the message names the flag."""


def require_at_least(args, checks: Iterable[Tuple[str, str, int]]) -> None:
    """Each (attribute, flag, minimum): the value, if set (not None), must be >= minimum."""
    for attr, flag, least in checks:
        v = getattr(args, attr, None)
        if v is not None and v < least:
            raise FlagError(f"{flag} must be >= {least}, got {v}")


@dataclass(frozen=True)
class Domain:
    topology: Topology  # one rank per TP group
    tp: int
    gpus_per_node: int  # physical GPUs

    @property
    def gpus(self) -> int:
        return self.topology.nodes * self.gpus_per_node

    def describe(self) -> str:
        t = self.topology
        if self.tp == 1:
            return (f"{self.gpus} GPUs = {t.nodes} node(s) x {self.gpus_per_node} GPUs, one domain rank per GPU "
                    f"({t.world_size} ranks), {t.nics_per_node} NIC(s) per node")
        return (f"{self.gpus} GPUs = {t.nodes} node(s) x {self.gpus_per_node} GPUs; TP {self.tp} -> "
                f"{t.world_size} domain ranks ({t.gpus_per_node} per node, each a TP group of {self.tp} GPUs), "
                f"{t.nics_per_node} NIC(s) per node for them")


def build_domain(args, profile, model) -> Domain:
    """The Domain of ``args`` (nodes, world_size, gpus_per_node, nics_per_node, tp; any may be absent)."""
    require_at_least(args, (("nodes", "--nodes", 1), ("world_size", "--world-size", 1),
                            ("gpus_per_node", "--gpus-per-node", 1), ("nics_per_node", "--nics-per-node", 1),
                            ("tp", "--tp/--tensor-model-parallel-size", 1)))
    tp = getattr(args, "tp", 1) or 1
    gpus = getattr(args, "gpus_per_node", None) or profile.gpus_per_node
    nics = getattr(args, "nics_per_node", None) or profile.nics_per_node
    if model.heads % tp or model.kv_heads % tp:
        raise FlagError(f"--tp {tp} does not divide {model.name}'s {model.heads} attention heads and "
                        f"{model.kv_heads} KV heads (set --tp/--tensor-model-parallel-size to a common divisor)")
    if gpus % tp:
        raise FlagError(f"--tp {tp} does not divide the {gpus} GPUs of a node (set --tp/--tensor-model-parallel-size "
                        "to a divisor, or --gpus-per-node)")
    nodes = getattr(args, "nodes", None)
    world = getattr(args, "world_size", None)
    if world is not None:
        if world % gpus:
            raise FlagError(f"--world-size {world} GPUs does not fill nodes of {gpus} GPUs (set --gpus-per-node "
                            "to a divisor, or --world-size to a multiple)")
        if nodes is not None and nodes * gpus != world:
            raise FlagError(f"--world-size {world} != --nodes {nodes} x --gpus-per-node {gpus}: give one of "
                            "--nodes / --world-size")
        nodes = world // gpus
    slices = gpus // tp
    dnics = max(1, min(slices, nics // tp))  # a TP group's NICs serve it as one (sim.runs.domain_topology)
    wiring = profile.gpu_to_nic if (tp == 1 and len(profile.gpu_to_nic) == slices
                                    and dnics == profile.nics_per_node) else ()
    return Domain(Topology(nodes or 1, slices, dnics, wiring), tp, gpus)
