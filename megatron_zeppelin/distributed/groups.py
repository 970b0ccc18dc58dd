"""Process groups from a Topology, created once and cached by rank set; passed explicitly.

Group creation is slow and, for ordinary groups, *collective over the whole default group*:
``torch.distributed.new_group`` must be called by every process of the job for every group, in the
same order, even by processes that are not members. ``GroupCache.create`` therefore takes the full
list of rank tuples, checks with one all_gather that every process asked for the same list in the
same order (raising GroupOrderError on all ranks otherwise, instead of hanging or silently pairing
the wrong groups), and creates them in that order. Ring groups of a Plan are different: each domain
plans its own batch, so they are created with ``use_local_synchronization`` (only members take
part; members of one ring create it together because they walk the same Plan in ring order).

A *domain* (Megatron's DP x CP ranks of one TP/PP slice) maps domain rank r to a global rank
``domain[r]``; the Topology speaks domain ranks. Worked example of the rank sets (no torch needed):

>>> from megatron_zeppelin.spec.topology import Topology
>>> t = Topology(2, 2)
>>> intra_node_sets(t, [10, 11, 12, 13]), rail_sets(t, [10, 11, 12, 13])
([(10, 11), (12, 13)], [(10, 12), (11, 13)])
"""

from __future__ import annotations

import hashlib
from typing import Dict, List, Optional, Sequence, Tuple

import torch.distributed as dist

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.planner.types import Plan
from megatron_zeppelin.spec.topology import Topology


class GroupOrderError(ZeppelinError):
    """Processes asked for different process groups (or in a different order)."""


def intra_node_sets(topo: Topology, domain: Sequence[int]) -> List[Tuple[int, ...]]:
    return [tuple(domain[r] for r in topo.node_ranks(n)) for n in range(topo.nodes)]


def rail_sets(topo: Topology, domain: Sequence[int]) -> List[Tuple[int, ...]]:
    return [tuple(domain[r] for r in topo.rail_ranks(i)) for i in range(topo.gpus_per_node)]


class GroupCache:
    """``domains``: every domain of the job as global-rank lists (default: one domain = the world).
    All processes must construct the cache with the same domains and call ``setup()`` together."""

    def __init__(self, topology: Topology, domains: Optional[Sequence[Sequence[int]]] = None):
        self.topology = topology
        world = dist.get_world_size()
        self.domains = [tuple(d) for d in (domains or [range(world)])]
        for d in self.domains:
            if len(d) != topology.world_size:
                raise GroupOrderError(f"a domain has {len(d)} ranks but the topology has {topology.world_size} "
                                      f"({topology.describe()}): check --zeppelin-gpus-per-node and the DP x CP size")
        me = dist.get_rank()
        mine = [d for d in self.domains if me in d]
        if len(mine) != 1:
            raise GroupOrderError(f"global rank {me} is in {len(mine)} domains; it must be in exactly one")
        self.domain = mine[0]
        self._groups: Dict[Tuple[int, ...], object] = {}
        self.created = 0  # number of new_group calls made by this process (tests check caching)

    def get(self, ranks: Sequence[int]):
        key = tuple(sorted(ranks))
        if key not in self._groups:
            raise GroupOrderError(f"no process group for ranks {key}: create it with GroupCache.create/setup first")
        return self._groups[key]

    def create(self, rank_sets: Sequence[Sequence[int]]) -> None:
        """Collective over the default group: every process passes the same list in the same order."""
        keys = [tuple(sorted(r)) for r in rank_sets]
        digest = hashlib.sha256(repr(keys).encode()).hexdigest()[:16]
        seen: List[Optional[str]] = [None] * dist.get_world_size()
        dist.all_gather_object(seen, digest)
        if len(set(seen)) != 1:
            bad = [r for r, d in enumerate(seen) if d != seen[0]]
            raise GroupOrderError(f"processes {bad} asked for different process groups than process 0: every "
                                  "process must create every group (members or not) in the same order")
        for key in dict.fromkeys(keys):  # same order everywhere; duplicates once
            if key in self._groups:
                continue
            g = dist.new_group(list(key))
            self.created += 1
            if dist.get_rank() in key:
                self._groups[key] = g
            else:
                self._groups[key] = None  # not a member: remembered so it is never created twice

    def setup(self) -> "GroupCache":
        """Intra-node groups and rails of every domain (collective, once)."""
        sets = []
        for d in self.domains:
            sets += intra_node_sets(self.topology, d) + rail_sets(self.topology, d)
        self.create(sets)
        return self

    def intra_node(self):
        r = self.domain.index(dist.get_rank())
        return self.get(tuple(self.domain[x] for x in self.topology.node_ranks(self.topology.node_of(r))))

    def rail(self):
        r = self.domain.index(dist.get_rank())
        return self.get(tuple(self.domain[x] for x in self.topology.rail_ranks(self.topology.local_of(r))))

    def ring_groups(self, plan: Plan) -> Dict[int, object]:
        """Groups of the plan's rings that contain this process (only members call new_group)."""
        me = dist.get_rank()
        out = {}
        for ring in plan.rings:  # plan order: all members of a ring meet it in the same order
            ranks = tuple(sorted(self.domain[r] for r in ring.ranks))
            if me not in ranks:
                continue
            if ranks not in self._groups or self._groups[ranks] is None:
                self._groups[ranks] = dist.new_group(list(ranks), use_local_synchronization=True)
                self.created += 1
            out[ring.id] = self._groups[ranks]
        return out
