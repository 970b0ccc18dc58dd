"""Length thresholds of Zeppelin's three classes, from the cost model's crossovers (never constants).

- ``local_max``: below ``crossover_length(2, "nvlink")`` even the smallest intra-node ring (2 ranks)
  cannot hide its K/V transfer behind its attention compute, so shorter documents always stay whole
  on one rank; longer ones may run on intra-node rings (the partitioner splits them only when they
  do not fit one rank's share of the batch).
- ``intra_max``: from ``crossover_length(2, "nic")`` (the smallest ring across 2 nodes, routed over
  all the node's NICs when routing is on) a document's ring steps can hide the inter-node transfer,
  so it may span nodes; larger inter rings need proportionally longer documents (the partitioner
  checks each size). A document over one node's token capacity spans nodes whether or not it hides.

The classes are eligibility ranges: local <= local_max < intra <= intra_max < inter; a document
may always take a class of a lower range (an inter-eligible document that fits one node stays in it).

Worked example (toy model and cluster of planner/testing.py, 2 nodes x 4 GPUs, one NIC per GPU):

>>> from megatron_zeppelin.planner.testing import toy_context
>>> ctx = toy_context(nodes=2, gpus=4)
>>> ctx.cost.crossover_length(2, "nvlink"), ctx.cost.crossover_length(2, "nic", share=inter_share(ctx))
(3096, 12884)
>>> th = zeppelin_thresholds(ctx)
>>> th.local_max, th.intra_max
(3095, 12883)
>>> print(th.reason.splitlines()[0].split(";")[0])
local <= 3095 tokens: a 2-rank NVLink ring step hides its K/V transfer only from 3096 tokens
"""

from __future__ import annotations

from megatron_zeppelin.planner.context import PlanContext
from megatron_zeppelin.planner.types import Thresholds
from megatron_zeppelin.spec.words import Link


def inter_share(ctx: PlanContext) -> float:
    """Bandwidth share of one inter-node ring hop: routed over all the node's NICs when routing is
    on, else the one NIC wired to the sending GPU."""
    topo = ctx.topology
    # Routed, a hop is cut over the node NICs but pays NVLink dispatch and combine stages too and
    # shares the NICs with the other rings crossing the node: count it as two NICs worth of time.
    return min(1.0, 2.0 / topo.nics_per_node) if ctx.config.routing_enabled(topo.nodes) else 1.0


def zeppelin_thresholds(ctx: PlanContext) -> Thresholds:
    """The class ranges for this model and cluster (the batch does not enter: they are crossovers)."""
    topo, cost = ctx.topology, ctx.cost
    g, cap = topo.gpus_per_node, ctx.capacity
    limit = max(1, cap * topo.world_size)
    lines = []
    if g >= 2:
        x_nv = cost.crossover_length(2, Link.NVLINK)
        local_max = max(0, x_nv - 1)
        lines.append(f"local <= {local_max} tokens: a 2-rank NVLink ring step hides its K/V transfer "
                     f"only from {x_nv} tokens; longer documents split over an intra-node ring when "
                     "they do not fit one rank's share of the batch")
    if topo.nodes < 2:
        th_intra = limit
        lines.append("one node: no document spans nodes")
        if g < 2:
            return Thresholds(limit, limit, "one rank: every document is local")
    else:
        share = inter_share(ctx)
        x_nic = cost.crossover_length(2, Link.NIC, share)
        fits_node = g * cap
        inter_from = min(fits_node + 1, x_nic)
        th_intra = inter_from - 1
        how = f"routed over {topo.nics_per_node} NICs" if share < 1 else "over one NIC"
        lines.append(
            f"intra <= {th_intra} tokens: from {inter_from} a document may span nodes, where a 2-rank "
            f"ring across 2 nodes hides its transfer {how} (from {x_nic}; larger rings need longer "
            f"documents); it does when no node has room for its share; any document over one "
            f"node's capacity {fits_node} spans nodes")
    if g < 2:
        local_max = th_intra
        lines.insert(0, f"local <= {local_max}: one GPU per node, no intra-node rings")
    local_max = min(local_max, th_intra)
    return Thresholds(local_max, th_intra, "\n".join(lines))
