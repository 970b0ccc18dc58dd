"""Length thresholds of Zeppelin's three classes, from the cost model's crossovers (never constants).

- ``local_max``: below ``crossover_length(2, "nvlink")`` even the smallest intra-node ring (2 ranks)
  cannot hide its K/V transfer behind its attention compute, so shorter documents stay whole on one
  rank; longer ones run on intra-node rings.
- ``intra_max``: a document spans nodes only when (a) its balanced placement needs more than one
  node (split over a whole node, one member's share still exceeds the balance granule, or the
  document does not fit a node's token capacity) and (b) its ring steps hide the inter-node transfer
  on the smallest inter ring (two nodes; over all the node's NICs when routing is on). A document
  that does not fit one node spans nodes whether or not it hides.

Both conditions are monotone in the length, so the classes are plain length ranges:
local <= local_max < intra <= intra_max < inter.

Worked example (toy model and cluster of planner/testing.py, 2 nodes x 4 GPUs, one NIC per GPU):

>>> from megatron_zeppelin.planner.testing import toy_context
>>> ctx = toy_context(nodes=2, gpus=4)
>>> ctx.cost.crossover_length(2, "nvlink"), ctx.cost.crossover_length(6, "nic", share=inter_share(ctx))
(3096, 38652)
>>> th = zeppelin_thresholds(ctx, granule_s=1e-3)
>>> th.local_max, th.intra_max
(3095, 38651)
>>> print(th.reason.splitlines()[0])
local <= 3095 tokens: a 2-rank NVLink ring step hides its K/V transfer only from 3096 tokens
"""

from __future__ import annotations

from .context import PlanContext
from .types import Thresholds


def member_cost_s(ctx: PlanContext, length: int, ring: int) -> float:
    """What one ring member of a ``length``-token document costs the balance: its attention, plus
    its linear share when the remap layer is off (then tokens are not re-balanced)."""
    t = ctx.cost.ring_member_attention_s(length, ring)
    if not ctx.config.remap:
        t += ctx.cost.linear_s(-(-length // max(1, ring)))
    return t


def inter_share(ctx: PlanContext) -> float:
    """Bandwidth share of one inter-node ring hop: routed over all the node's NICs when routing is
    on, else the one NIC wired to the sending GPU."""
    topo = ctx.topology
    # Routed, a hop is cut over the node NICs but pays NVLink dispatch and combine stages too and
    # shares the NICs with the other rings crossing the node: count it as two NICs worth of time.
    return min(1.0, 2.0 / topo.nics_per_node) if ctx.config.routing_enabled(topo.nodes) else 1.0


def min_inter_ring(gpus_per_node: int) -> int:
    """Smallest inter-node ring: just over one node, spread evenly over two nodes."""
    return 2 * -(-(gpus_per_node + 1) // 2)


def _first_true(pred, lo: int, hi: int) -> int:
    """Smallest L in [lo, hi] with pred(L) (pred monotone), or hi + 1."""
    if not pred(hi):
        return hi + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def zeppelin_thresholds(ctx: PlanContext, granule_s: float) -> Thresholds:
    """Thresholds for a batch whose balance granule (largest cost one rank may take as one piece)
    is ``granule_s`` seconds."""
    topo, cost = ctx.topology, ctx.cost
    g, cap = topo.gpus_per_node, ctx.capacity
    limit = max(1, cap * topo.world_size)
    lines = []
    if g >= 2:
        x_nv = cost.crossover_length(2, "nvlink")
        local_max = max(0, x_nv - 1)
        lines.append(f"local <= {local_max} tokens: a 2-rank NVLink ring step hides its K/V transfer "
                     f"only from {x_nv} tokens")
    if topo.nodes < 2:
        th_intra = limit
        lines.append("one node: no document spans nodes")
        if g < 2:
            return Thresholds(limit, limit, "one rank: every document is local")
    else:
        gi = min_inter_ring(g) if g >= 2 else 2
        share = inter_share(ctx)
        x_nic = cost.crossover_length(gi, "nic", share)
        fits_node = g * cap
        need = _first_true(lambda L: member_cost_s(ctx, L, g) > granule_s, 1, limit)
        inter_from = min(fits_node + 1, max(need, x_nic))
        th_intra = inter_from - 1
        how = f"over {topo.nics_per_node} NICs (routing on)" if share < 1 else "over one NIC"
        lines.append(
            f"intra <= {th_intra} tokens: inter-node from {inter_from}, where a whole-node ring's member "
            f"exceeds the {granule_s:.3g} s balance granule (from {need}) and a {gi}-rank ring across "
            f"2 nodes hides its transfer {how} (from {x_nic}); any document over one node's capacity "
            f"{fits_node} spans nodes")
    if g < 2:
        local_max = th_intra
        lines.insert(0, f"local <= {local_max}: one GPU per node, no intra-node rings")
    local_max = min(local_max, th_intra)
    return Thresholds(local_max, th_intra, "\n".join(lines))
