"""Links and bandwidth sharing: which links a message uses, and max-min fair rates by progressive filling.

A message uses the sender's out-port and the receiver's in-port (topology.link_ports, which the
prediction uses too). Over NVLink these are the GPUs' ports (``nv_out`` of ``src``, ``nv_in`` of
``dst``); over the network the message leaves on NIC ``op.nic`` and arrives on the NIC wired to
``dst`` (``nic_out`` / ``nic_in``); a hop of a level above the NIC's (a spine: the profile's
``levels``) also loads that level's port of both NICs (``spine_out`` / ``spine_in``). Links are
full duplex: each direction has the profile's bandwidth of its class.

Concurrent transfers share a link fairly: progressive filling raises every unfrozen flow's rate at
the same pace until some link is full, freezes the flows through it, and repeats (max-min fairness).

Two flows leaving the same port share it; a third flow elsewhere keeps its full rate:

>>> import numpy as np
>>> fair_rates(np.array([[0, 1], [0, 2], [3, 4]]), np.array([10.0, 10.0, 10.0, 10.0, 10.0]))
array([ 5.,  5., 10.])

Progressive filling gives the bandwidth a bottlenecked flow cannot use to the others: flows 0 and 1
share link 0 (10), but flow 1 is held to 2 by its slow link 3, so flow 0 gets the other 8:

>>> fair_rates(np.array([[0, 1], [0, 3]]), np.array([10.0, 10.0, 10.0, 2.0]))
array([8., 2.])
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np

from megatron_zeppelin.spec.topology import Topology, link_ports
from megatron_zeppelin.spec.words import Link

LinkKey = Tuple[str, int]


class LinkTable:
    """Index of the links of one topology with their capacities (bytes/s).

    With a ``host`` whose ranks share its cores (spec/host.py HostModel, ``cores`` > 0: the CPU
    validation's; None on GPUs) it also holds the CPU as shared resources for compute tasks
    (events.TaskGraph.work; sim/host.py): a core per rank (capacity 1: a rank's kernels run one at a
    time), an I/O thread per rank (capacity 1: the transport's copies of its messages, ``copy_Bps``
    bytes per CPU second, None = free) and the host (capacity ``cores``); ``cpu(rank)`` and
    ``io(rank)`` name them.

    >>> from megatron_zeppelin.spec.host import HostModel
    >>> from megatron_zeppelin.spec.topology import Topology
    >>> t = LinkTable(Topology(1, 2), 1.0, 1.0, host=HostModel(cores=1))
    >>> t.cpu(1), t.io(1), t.capacity[list(t.cpu(1))].tolist(), LinkTable(Topology(1, 2), 1.0, 1.0).cpu(1)
    ((9, 12), (11, 12), [1.0, 1.0], None)
    """

    def __init__(self, topo: Topology, nvlink_Bps: float, nic_Bps: float,
                 levels: Mapping[str, float] = MappingProxyType({}), host=None):
        self.topo = topo
        shared = host is not None and host.cores > 0  # compute shares the host's cores
        self.host_cores = float(host.cores) if shared else 0.0
        self.copy_Bps = (host.copy_Bps or None) if shared else None  # None: messages take no CPU
        self.keys: List[LinkKey] = []
        self.index: Dict[LinkKey, int] = {}
        caps = []
        w = topo.world_size
        cpu = (("core", w, 1.0), ("io", w, 1.0), ("host", 1, self.host_cores)) if shared else ()
        # ``levels``: bytes/s per NIC of each network level above the NIC's (its own port per NIC)
        above = tuple((f"{name}_{d}", topo.num_nics, bps) for name, bps in levels.items() for d in ("out", "in"))
        for kind, n, cap in (("nv_out", topo.world_size, nvlink_Bps), ("nv_in", topo.world_size, nvlink_Bps),
                             ("nic_out", topo.num_nics, nic_Bps), ("nic_in", topo.num_nics, nic_Bps)) + cpu + above:
            for i in range(n):
                self.index[(kind, i)] = len(self.keys)
                self.keys.append((kind, i))
                caps.append(cap)
        self.capacity = np.array(caps, dtype=float)
        self._of: Dict[tuple, Tuple[int, ...]] = {}
        self._cpu = ({r: (self.index[("core", r)], self.index[("host", 0)]) for r in range(w)},
                     {r: (self.index[("io", r)], self.index[("host", 0)]) for r in range(w)}) if shared else None

    @classmethod
    def of_cost(cls, cost) -> "LinkTable":
        """The links of ``cost``'s topology at its profile's bandwidth, every cluster level included,
        and its host's CPU where it has one (``cost.host``)."""
        return cls(cost.topology, cost.bandwidth(Link.NVLINK), cost.bandwidth(Link.NIC),
                   {k: cost.bandwidth(k) for k in cost.link_classes[2:]}, cost.host)

    def link_class(self, kind: str) -> str:
        """The link class a port kind belongs to (``nv_out`` -> nvlink, ``spine_in`` -> spine)."""
        return Link.NVLINK if kind.startswith("nv_") else kind.rsplit("_", 1)[0]

    def of(self, link: str, src: int, dst: int, nic: int) -> Tuple[int, ...]:
        at = (link, src, dst, nic)  # every message of a layer asks again: kept (one tuple per pair)
        ports = self._of.get(at)
        if ports is None:
            ports = self._of[at] = tuple(self.index[k] for k in link_ports(link, src, dst, nic, self.topo))
        return ports

    def cpu(self, rank: int):
        """(rank's core, host) resource indices for a compute task; None when the CPU is not shared."""
        return None if self._cpu is None else self._cpu[0][rank]

    def io(self, rank: int):
        """(rank's I/O thread, host) for the CPU its messages' copies take; None when not shared."""
        return None if self._cpu is None else self._cpu[1][rank]

    def copy_s(self, nbytes: float) -> float:
        """CPU seconds one end of a message spends copying it (only where ``copy_Bps`` is not None)."""
        return nbytes / self.copy_Bps


def fair_rates(flow_links: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rate of each flow; ``flow_links`` is [flows, k] link indices (a flow of fewer
    links repeats none: pad it with an index of a link of unbounded capacity, see pad_links)."""
    n = len(flow_links)
    rate = np.zeros(n)
    if n == 0:
        return rate
    rem = capacity.astype(float).copy()
    active = np.ones(n, dtype=bool)
    nl = len(capacity)
    while active.any():
        cnt = np.bincount(flow_links[active].ravel(), minlength=nl)  # unfrozen flows per link
        used = cnt > 0
        share = np.full(nl, np.inf)
        share[used] = rem[used] / cnt[used]
        inc = share.min()
        rate[active] += inc
        rem[used] -= inc * cnt[used]
        full = used & (rem <= 1e-9 * capacity)  # links saturated at this level (ties together)
        active &= ~full[flow_links].any(axis=1)
    return rate


def fair_shares(groups: Mapping[Tuple[int, ...], int], capacity: Sequence[float]) -> Dict[Tuple[int, ...], float]:
    """``fair_rates`` for the event loop: {links: the rate of each of its flows} for ``groups``
    {a flow's links: how many active flows use them}; links are unpadded tuples (``capacity[l]``).
    Flows on the same links get the same rate, so progressive filling runs per group (a handful),
    in plain Python (the loop calls it thousands of times per layer on a few dozen flows, where
    numpy's per-call overhead dominates). Every float is computed as ``fair_rates`` computes it
    (per-link counts are exact integers; a flow's rate is the sum of the increments of the rounds it
    stayed unfrozen, added in the same order), so the rates are bit-identical
    (tests/unit/test_sim_core.py compares them).

    >>> fair_shares({(0, 1): 1, (0, 2): 1, (3, 4): 1}, [10.0] * 5) == {(0, 1): 5.0, (0, 2): 5.0, (3, 4): 10.0}
    True
    >>> r = fair_shares({(0, 1): 3, (0, 3): 1}, [10.0, 10.0, 10.0, 2.0])   # 3 flows share the 8 left on link 0
    >>> r[(0, 3)], round(r[(0, 1)], 6)
    (2.0, 2.666667)
    """
    cnt: Dict[int, int] = {}  # unfrozen flows per link
    users: Dict[int, list] = {}  # link -> the groups through it
    for ls, m in groups.items():
        for l in ls:
            cnt[l] = cnt.get(l, 0) + m
            users.setdefault(l, []).append(ls)
    rem = {l: capacity[l] for l in cnt}
    rate: Dict[Tuple[int, ...], float] = {}
    level = 0.0  # every unfrozen flow's rate: the increments so far
    while cnt:
        inc = min([rem[l] / c for l, c in cnt.items()])
        level += inc
        full = []
        for l, c in cnt.items():
            r = rem[l] = rem[l] - inc * c
            if r <= 1e-9 * capacity[l]:  # saturated at this level (ties together)
                full.append(l)
        for l in full:  # freeze the flows through a full link
            for ls in users[l]:
                if ls not in rate:
                    rate[ls] = level
                    m = groups[ls]
                    for x in ls:
                        c = cnt[x] - m
                        if c:
                            cnt[x] = c
                        else:
                            del cnt[x]
    return rate


UNBOUNDED = 1e300  # capacity of the padding link: never the bottleneck, never full


def pad_links(rows: Sequence[Tuple[int, ...]], capacity: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """([flows, k] link indices, capacities) for flows of 2 or more links: shorter rows point at one
    extra link of UNBOUNDED capacity.

    >>> pad_links([(0, 1), (0, 1, 2, 3)], np.ones(4))[0].tolist()
    [[0, 1, 4, 4], [0, 1, 2, 3]]
    """
    k = max((len(r) for r in rows), default=2)
    if all(len(r) == k for r in rows):
        return np.array(rows, dtype=np.int64).reshape(-1, k), capacity
    pad = len(capacity)
    return (np.array([tuple(r) + (pad,) * (k - len(r)) for r in rows], dtype=np.int64),
            np.append(capacity, UNBOUNDED))
