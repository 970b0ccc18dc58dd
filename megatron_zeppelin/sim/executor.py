"""The schedule executor's timing: one (queue, step) of CommOps on every rank, as the runtime runs it.

As distributed/executor.py (and planner/cost/predict.py ``_exchange``): every rank posts, at its gate
(whatever must be done first: the previous step, the compute that frees the receive buffer, the
kernel that produced the data), its receives and the sends of the messages it originates, all stages
at once. A proxy's relay forwards each routed piece as soon as it has arrived, one after the other
in the program's order (planner/program.py ``step_order``: stage order; the chunks of a routed piece
as a pipeline, chunk i+1's dispatch with chunk i's transfer), independent of the proxy's compute. So:
1. a flow leaving its message's source waits for the sender's and the receiver's post;
2. a relayed flow waits for the flow(s) that brought its rows to the proxy, the proxy's previous
   relayed forward (the relay posts them in order) and the receiver's post;
3. the chunks of one piece on one hop flow one after the other (each its own flow; the links'
   fair sharing overlaps the chunks of different stages);
4. a rank's part of the step (its wait()) is its gate plus only the flows it sends as message
   source or receives as message destination: a pure proxy waits for nothing.

``Hop`` is one op as the simulator moves it (bytes already scaled: x2 in a ring backward, where K/V
and dK/dV travel together), with its message (``msg_src`` -> ``msg_dst``, ``msg`` = (ring, block)
telling apart messages between the same ends) and rows [``start``, ``stop``). ``msg_src`` /
``msg_dst`` of -1 mean a one-hop message (the hop's own ends). ``reverse_hops`` turns a forward op
list around (Llama-3 CP's dK/dV reduce-scatter, a remap's backward): same rows and bytes, ends
swapped, stage order mirrored. On a shared host CPU (LinkTable ``copy_Bps``, from the validation's
spec/host.py HostModel; None on GPUs) a hop also takes CPU at both ends to copy its bytes (the
transport's copies, sharing the cores with compute), and is done when both copies and the transfer are.

>>> from megatron_zeppelin.spec.topology import Topology
>>> from megatron_zeppelin.sim.network import LinkTable
>>> from megatron_zeppelin.sim.events import TaskGraph
>>> topo = Topology(1, 2); g = TaskGraph(); links = LinkTable(topo, 100.0, 10.0)
>>> end = run_step(g, links, topo, [Hop("direct", 0, 1, 1000, "nvlink", -1, "x")], {0: [], 1: []}, {"nvlink": 0.0, "nic": 0.0})
>>> float(g.run(links.capacity).end[end[1]])
10.0
>>> [(h.stage, h.src, h.dst, h.nic) for h in reverse_hops([Hop("transfer", 0, 5, 8, "nic", 0, "x")], Topology(2, 4, 2))]
[('transfer', 5, 0, 2)]

A routed message 0 -> 3 (2 nodes x 2 GPUs): rows [0, 10) dispatched to proxy 1, sent on its NIC to 3.
The proxy posts late (its compute runs until t = 50): the relay does not wait for it beyond its own
receive being posted, and the proxy's part of the step is only its gate.

>>> topo = Topology(2, 2, 2); g = TaskGraph(); links = LinkTable(topo, 100.0, 10.0)
>>> busy = g.delay(50.0)
>>> hops = [Hop("dispatch", 0, 1, 1000, "nvlink", -1, "x", 0, 3, 0, 10),
...         Hop("transfer", 1, 3, 1000, "nic", topo.nic_of(1), "x", 0, 3, 0, 10)]
>>> end = run_step(g, links, topo, hops, {1: [busy]}, {"nvlink": 0.0, "nic": 0.0})
>>> res = g.run(links.capacity)
>>> [float(res.end[end[r]]) for r in (0, 1, 3)]  # dispatch ends at 50 + 10, transfer 100 s later
[60.0, 50.0, 160.0]
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from megatron_zeppelin.planner.program import step_order
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.sim.events import TaskGraph
from megatron_zeppelin.sim.network import LinkTable
from megatron_zeppelin.spec.words import MIRROR, Link

@dataclass(frozen=True)
class Hop:
    stage: str
    src: int
    dst: int
    nbytes: float
    link: str
    nic: int  # sending NIC's global id for a NIC hop, else -1
    cat: str  # timeline category of the message (ring_inter, ring_intra, remap, ...)
    msg_src: int = -1  # the message's source (-1: ``src``, a one-hop message)
    msg_dst: int = -1  # the message's destination (-1: ``dst``)
    start: int = 0  # token rows [start, stop) of the message this hop carries
    stop: int = 0
    msg: Tuple = ()  # (ring, block): tells apart messages with the same ends in one step

    @property
    def origin(self) -> int:
        return self.src if self.msg_src < 0 else self.msg_src

    @property
    def target(self) -> int:
        return self.dst if self.msg_dst < 0 else self.msg_dst

    @property
    def key(self) -> Tuple:
        return (self.cat, self.msg, self.origin, self.target)


def reverse_hops(hops: Sequence[Hop], topo: Topology) -> List[Hop]:
    return [replace(h, stage=MIRROR[h.stage], src=h.dst, dst=h.src,
                    nic=topo.nic_of(h.dst) if h.link != Link.NVLINK else -1,
                    msg_src=h.msg_dst, msg_dst=h.msg_src) for h in hops]


def run_step(g: TaskGraph, links: LinkTable, topo: Topology, hops: Sequence[Hop],
             gates: Mapping[int, Sequence[Optional[int]]], latency: Mapping[str, float]) -> Dict[int, int]:
    """Add one step's messages to ``g``; return {rank: join task done when the rank's part of the step
    is done (its wait() returns)}. ``gates[rank]`` lists the tasks the rank waits for before it posts
    the step."""
    ranks = sorted({h.src for h in hops} | {h.dst for h in hops})
    post = {r: g.join(list(gates.get(r, ()))) for r in ranks}  # the rank posts all its stages at once
    own: Dict[int, List[int]] = {r: [post[r]] for r in ranks}
    arrived: Dict[Tuple, List[Tuple[int, int, int]]] = defaultdict(list)  # (message, rank) -> (start, stop, flow)
    relay: Dict[int, int] = {}  # proxy -> its relay's last forward (posted in order)
    copies = links.copy_Bps is not None  # a shared CPU host's transport copies every message (sim/host.py)
    # a one-hop message (msg_src -1: a remap's, a collective's) is its own: never a chunk of another
    order, chunk = step_order([(h.stage, h.src, h.dst, h.key if h.msg_src >= 0 else ("hop", i), h.start, h.stop,
                                h.src != h.origin) for i, h in enumerate(hops)])
    chained = {(h.key, h.stage, h.src, h.dst) for h, c in zip(hops, chunk) if c > 0}
    last: Dict[Tuple, int] = {}  # a chunked piece's hop: the flow of its previous chunk
    for i in order:  # the program's order: phases, chunks of a routed piece as a pipeline
        h = hops[i]
        deps = [post[h.src], post[h.dst]]
        if h.src != h.origin:  # relayed: when its rows are here, after the previous forward
            came = [t for a, b, t in arrived[(h.key, h.src)] if a <= h.start and h.stop <= b]
            if not came:  # the runtime fails the same way (distributed/executor.py _rows_of)
                raise ValueError(f"{h.stage} {h.src}->{h.dst} forwards rows [{h.start}, {h.stop}) of "
                                 f"message {h.origin}->{h.target} {h.msg} that never reached rank {h.src}")
            relay[h.src] = g.join([relay.get(h.src, post[h.src]), *came])
            deps = [relay[h.src], post[h.dst]]
        chain = (h.key, h.stage, h.src, h.dst)
        if chain in chained and chain in last:  # a piece's chunks pass one hop one after the other
            deps.append(last[chain])
        t = g.flow(h.nbytes, links.of(h.link, h.src, h.dst, h.nic), latency[h.link],
                   deps=deps, tag=(h.src, h.cat, f"{h.stage} {h.src}->{h.dst}"))
        if copies and h.nbytes > 0:  # both ends copy the bytes, competing with compute
            cpu = links.copy_s(h.nbytes)
            ends = [g.work(cpu, links.io(r), deps=deps, tag=(r, "copy", f"copy {h.src}->{h.dst}"))
                    for r in (h.src, h.dst)]
            t = g.join([t, *ends])
        last[chain] = t
        if h.dst != h.target:
            arrived[(h.key, h.dst)].append((h.start, h.stop, t))
        if h.src == h.origin:
            own[h.src].append(t)
        if h.dst == h.target:
            own[h.dst].append(t)
    return {r: g.join(own[r]) for r in ranks}
