"""The schedule executor's timing: one (queue, step) of CommOps on every rank, as the runtime runs it.

Each rank runs its ops of a step stage by stage in STAGES order (direct; dispatch -> transfer ->
combine), posting the stage's sends and receives together and waiting for all of them before the
next stage. So a message of stage k starts when both its ends have finished stage k-1 of this step
and passed their gate (whatever must be done before the rank posts the step: the previous step, the
compute that frees the receive buffer, the kernel that produced the data).

``Hop`` is one op as the simulator moves it (bytes already scaled: x2 in a ring backward, where K/V
and dK/dV travel together). ``reverse_hops`` turns a forward op list around (Llama-3 CP's dK/dV
reduce-scatter, a remap's backward): same rows and bytes, ends swapped, stage order mirrored.

>>> from megatron_zeppelin.topology import Topology
>>> from megatron_zeppelin.sim.network import LinkTable
>>> from megatron_zeppelin.sim.events import TaskGraph
>>> topo = Topology(1, 2); g = TaskGraph(); links = LinkTable(topo, 100.0, 10.0)
>>> end = run_step(g, links, topo, [Hop("direct", 0, 1, 1000, "nvlink", -1, "x")], {0: [], 1: []}, {"nvlink": 0.0, "nic": 0.0})
>>> float(g.run(links.capacity).end[end[1]])
10.0
>>> [(h.stage, h.src, h.dst, h.nic) for h in reverse_hops([Hop("transfer", 0, 5, 8, "nic", 0, "x")], Topology(2, 4, 2))]
[('transfer', 5, 0, 2)]
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional, Sequence

from ..planner.types import STAGES
from ..topology import Topology
from .events import TaskGraph
from .network import LinkTable

_MIRROR = {"direct": "direct", "dispatch": "combine", "transfer": "transfer", "combine": "dispatch"}


@dataclass(frozen=True)
class Hop:
    stage: str
    src: int
    dst: int
    nbytes: float
    link: str
    nic: int  # sending NIC's global id for a NIC hop, else -1
    cat: str  # timeline category of the message (ring_inter, ring_intra, remap, ...)


def reverse_hops(hops: Sequence[Hop], topo: Topology) -> List[Hop]:
    return [replace(h, stage=_MIRROR[h.stage], src=h.dst, dst=h.src,
                    nic=topo.nic_of(h.dst) if h.link == "nic" else -1) for h in hops]


def run_step(g: TaskGraph, links: LinkTable, topo: Topology, hops: Sequence[Hop],
             gates: Mapping[int, Sequence[Optional[int]]], latency: Mapping[str, float]) -> Dict[int, int]:
    """Add one step's messages to ``g``; return {rank: join task done when the rank's part of the step
    is done}. ``gates[rank]`` lists the tasks the rank waits for before it posts the step."""
    by_stage: Dict[str, List[Hop]] = defaultdict(list)
    for h in hops:
        by_stage[h.stage].append(h)
    ranks = sorted({h.src for h in hops} | {h.dst for h in hops})
    gate = {r: list(gates.get(r, ())) for r in ranks}
    for stage in STAGES:
        stage_hops = by_stage.get(stage)
        if not stage_hops:
            continue
        involved = sorted({h.src for h in stage_hops} | {h.dst for h in stage_hops})
        post = {r: g.join(gate[r]) for r in involved}  # the rank posts this stage's sends and receives
        mine: Dict[int, List[int]] = defaultdict(list)
        for h in stage_hops:
            t = g.flow(h.nbytes, links.of(h.link, h.src, h.dst, h.nic), latency[h.link],
                       deps=[post[h.src], post[h.dst]], tag=(h.src, h.cat, f"{h.stage} {h.src}->{h.dst}"))
            mine[h.src].append(t)
            mine[h.dst].append(t)
        for r in involved:
            gate[r] = [g.join(mine[r])]
    return {r: g.join(gate[r]) for r in ranks}
