"""Links and bandwidth sharing: which links a message uses, and max-min fair rates by progressive filling.

Every message uses exactly two links: the sender's out-port and the receiver's in-port. Over NVLink
these are the GPUs' ports (``nv_out`` of ``src``, ``nv_in`` of ``dst``); over the network the message
leaves on NIC ``op.nic`` and arrives on the NIC wired to ``dst`` (``nic_out`` / ``nic_in``). Links are
full duplex: each direction has the profile's bandwidth.

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

from typing import Dict, List, Tuple

import numpy as np

from ..topology import Topology

LinkKey = Tuple[str, int]


def op_links(link: str, src: int, dst: int, nic: int, topo: Topology) -> Tuple[LinkKey, LinkKey]:
    """(out-link, in-link) of one message. ``nic`` is the sending NIC's global id for a NIC hop."""
    if link == "nic":
        return ("nic_out", nic if nic >= 0 else topo.nic_of(src)), ("nic_in", topo.nic_of(dst))
    return ("nv_out", src), ("nv_in", dst)


class LinkTable:
    """Index of the links of one topology with their capacities (bytes/s).

    With ``host_cores`` > 0 (all ranks on one host CPU: profile ``host_cores``) it also holds the CPU
    as shared resources for compute tasks (events.TaskGraph.work): a core per rank (capacity 1: a
    rank's kernels run one at a time), an I/O thread per rank (capacity 1: the transport's copies of
    its messages, ``copy_Bps`` bytes per CPU second, 0 = free) and the host (capacity ``host_cores``);
    ``cpu(rank)`` and ``io(rank)`` name them.

    >>> from megatron_zeppelin.topology import Topology
    >>> t = LinkTable(Topology(1, 2), 1.0, 1.0, host_cores=1)
    >>> t.cpu(1), t.io(1), t.capacity[list(t.cpu(1))].tolist(), LinkTable(Topology(1, 2), 1.0, 1.0).cpu(1)
    ((9, 12), (11, 12), [1.0, 1.0], None)
    """

    def __init__(self, topo: Topology, nvlink_Bps: float, nic_Bps: float, host_cores: float = 0.0,
                 copy_Bps: float = 0.0):
        self.topo = topo
        self.host_cores = float(host_cores)
        self.copy_Bps = float(copy_Bps) if host_cores > 0 else 0.0
        self.keys: List[LinkKey] = []
        self.index: Dict[LinkKey, int] = {}
        caps = []
        w = topo.world_size
        cpu = (("core", w, 1.0), ("io", w, 1.0), ("host", 1, self.host_cores)) if host_cores > 0 else ()
        for kind, n, cap in (("nv_out", topo.world_size, nvlink_Bps), ("nv_in", topo.world_size, nvlink_Bps),
                             ("nic_out", topo.num_nics, nic_Bps), ("nic_in", topo.num_nics, nic_Bps)) + cpu:
            for i in range(n):
                self.index[(kind, i)] = len(self.keys)
                self.keys.append((kind, i))
                caps.append(cap)
        self.capacity = np.array(caps, dtype=float)

    def of(self, link: str, src: int, dst: int, nic: int) -> Tuple[int, int]:
        a, b = op_links(link, src, dst, nic, self.topo)
        return self.index[a], self.index[b]

    def cpu(self, rank: int):
        """(rank's core, host) resource indices for a compute task; None when the CPU is not modelled."""
        if self.host_cores <= 0:
            return None
        return self.index[("core", rank)], self.index[("host", 0)]

    def io(self, rank: int):
        """(rank's I/O thread, host) for the CPU its messages' copies take; None when not modelled."""
        if self.host_cores <= 0:
            return None
        return self.index[("io", rank)], self.index[("host", 0)]

    def copy_s(self, nbytes: float) -> float:
        """CPU seconds one end of a message spends copying it (0 when not modelled)."""
        return nbytes / self.copy_Bps if self.copy_Bps > 0 else 0.0


def fair_rates(flow_links: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rate of each flow; ``flow_links`` is [flows, 2] link indices."""
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
        active &= ~(full[flow_links[:, 0]] | full[flow_links[:, 1]])
    return rate
