"""Remap plan: from the attention layout to a token-balanced linear layout at least traffic cost.

The problem. Rank r holds c_r attention tokens (T in all, W ranks). The linear layout gives rank r
t_r tokens: floor(T/W) or ceil(T/W) (or, with per-rank ``capacities``, the water-filled level
min(cap_r, L) or min(cap_r, L+1)); *which* ranks get the +1 is free. Moving one token from s to d
costs 0 if s == d, ``a`` inside a node (NVLink) and ``b`` across nodes (NIC), a <= b (per-byte times
from the CostModel). Minimise sum_{s,d} cost(s,d) * f(s,d): a transportation problem whose targets
are themselves chosen.

The solution is EXACT, in O(W log W) (numpy), by two facts of this two-level cost:

1. Fixed targets. Surplus u_r = max(0, c_r - t_r) must leave rank r, so any flow moves at least
   M = sum_r u_r tokens; node n's net surplus X_n = max(0, C_n - T_n) (C_n, T_n: the node's counts
   and targets) must cross the node boundary, so at least X = sum_n X_n tokens cross nodes. Hence
   cost >= a*M + (b-a)*X. Matching surplus to deficit inside each node first, then across nodes,
   moves exactly M tokens of which exactly X cross nodes: it attains the bound.
2. Choosing the +1 ranks. Giving the k-th +1 of node n to rank r lowers M by one iff c_r > lo_r
   and X by one iff k <= C_n - sum_{r in n} lo_r. Taking a node's eligible ranks by surplus
   (c_r - lo_r) descending makes both indicators non-increasing in k, so the cost is a separable
   concave (in e_n, the node's number of +1s) sum; picking the e globally largest marginal gains
   a*[c_r > lo_r] + (b-a)*[k <= surplus of the node] is then optimal (standard exchange argument),
   and ties broken by (larger surplus, lower rank) never pick a node's k-th before its (k-1)-th.

(tests/unit/test_remap_plan.py checks optimality against scipy.optimize.linprog over the joint LP
with free targets; its matrix is a network matrix, so the LP optimum is integral.) Not modelled:
per-message latency, and which of a node's NICs the cross-node tokens leave by.

Surplus ranks send the *tail* of their attention layout (tokens that stay keep their order);
receivers append what they get in source-rank order.

Worked example: ranks 0 and 1 of one node hold 5 and 1 tokens.

>>> from megatron_zeppelin.spec.topology import Topology
>>> from megatron_zeppelin.planner.types import Segment
>>> att = ((Segment(0, 0, 5),), (Segment(1, 0, 1),))
>>> lin, moves = plan_remap(att, Topology(1, 2))
>>> lin
((Segment(doc=0, start=0, stop=3),), (Segment(doc=1, start=0, stop=1), Segment(doc=0, start=3, stop=5)))
>>> moves
(Move(src=0, dst=1, segments=(Segment(doc=0, start=3, stop=5),)),)

Two nodes of two ranks with counts 5, 0 | 1, 0 (6 tokens: two ranks get 2, two get 1). Giving
the +1s to the largest ranks (0 and 2) would send 2 tokens across nodes; giving both to node 0,
which has the surplus, sends 1:

>>> counts = [5, 0, 1, 0]
>>> balanced_targets(counts, Topology(2, 2))
[2, 2, 1, 1]
>>> transfer_matrix(counts, [2, 2, 1, 1], Topology(2, 2))
{(0, 1): 2, (0, 3): 1}
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.planner.errors import PlanError
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.planner.types import Move, Segment, segment_tokens
from megatron_zeppelin.spec.words import Link

DEFAULT_LINK_COSTS = (1.0, 8.0)  # (intra, inter) per token when no CostModel is given: NVLink ~8x a NIC


class RemapError(ZeppelinError):
    """Bad remap inputs (capacities that cannot hold the batch, wrong lengths)."""


class RemapCapacityError(RemapError, PlanError):
    """Linear-layout capacities that cannot hold the batch: a plan over capacity like any other, so a
    search skips that candidate (strategies.choose) and a capped plan falls back (portfolio/memory.py)."""


def link_costs(cost=None) -> Tuple[float, float]:
    """(intra-node, inter-node) cost of one token: per-token transfer time from the CostModel.
    The inter cost is clamped to be >= the intra cost (the exactness argument needs a <= b)."""
    if cost is None:
        return DEFAULT_LINK_COSTS
    per_tok = float(cost.hidden_bytes_per_token)
    a = per_tok / cost.bandwidth(Link.NVLINK)
    b = per_tok / cost.bandwidth(Link.NIC)
    return a, max(a, b)


def _levels(counts: np.ndarray, capacities: Optional[Sequence[int]]) -> Tuple[np.ndarray, np.ndarray]:
    """Per-rank (lo, hi) target bounds: hi - lo is 1 for ranks that may take one of the +1 tokens."""
    total, w = int(counts.sum()), len(counts)
    if capacities is None:
        base = total // w
        return np.full(w, base, np.int64), np.full(w, base + 1, np.int64)
    cap = np.asarray(capacities, dtype=np.int64)
    if cap.shape != (w,):
        raise RemapError(f"capacities has {cap.size} entries for {w} ranks: pass one linear-layout "
                         "capacity per rank")
    if (cap < 0).any():
        raise RemapError(f"capacities must be >= 0, got {int(cap.min())}")
    if int(cap.sum()) < total:
        raise RemapCapacityError(f"capacities hold {int(cap.sum())} tokens but the batch has {total}: raise the "
                         "per-rank linear-layout capacities (or --zeppelin-capacity-tokens)")
    # Largest level L with sum(min(cap, L)) <= total (bisection; sum is monotone in L).
    lo_l, hi_l = 0, int(cap.max()) + 1
    while hi_l - lo_l > 1:
        mid = (lo_l + hi_l) // 2
        if int(np.minimum(cap, mid).sum()) <= total:
            lo_l = mid
        else:
            hi_l = mid
    return np.minimum(cap, lo_l), np.minimum(cap, lo_l + 1)


def balanced_targets(counts: Sequence[int], topo: Optional[Topology] = None,
                     capacities: Optional[Sequence[int]] = None, costs: Tuple[float, float] = DEFAULT_LINK_COSTS
                     ) -> List[int]:
    """Linear-layout token count per rank (max - min <= 1 without capacities), the +1 tokens placed
    to minimise the remap cost (fact 2 of the module docstring)."""
    c = np.asarray(counts, dtype=np.int64)
    w = len(c)
    topo = topo or Topology(1, max(1, w))
    lo, hi = _levels(c, capacities)
    extra = int(c.sum() - lo.sum())
    tgt = lo.copy()
    if extra == 0:
        return tgt.tolist()
    a, b = costs
    elig = np.nonzero(hi > lo)[0]
    sur = c[elig] - lo[elig]
    node = elig // topo.gpus_per_node
    # Position k (0-based) of each eligible rank inside its node, by (surplus desc, rank asc).
    order = np.lexsort((elig, -sur, node))
    node_o = node[order]
    first = np.searchsorted(node_o, node_o, side="left")
    k = np.arange(len(order)) - first
    node_sur = np.bincount(np.arange(w) // topo.gpus_per_node, weights=(c - lo).astype(np.float64),
                           minlength=topo.nodes).astype(np.int64)
    gain = a * (sur[order] > 0) + (b - a) * (k < node_sur[node_o])
    pick = np.lexsort((elig[order], -sur[order], -gain))[:extra]
    tgt[elig[order][pick]] += 1
    return tgt.tolist()


def transfer_matrix(counts: Sequence[int], targets: Sequence[int], topo: Topology
                    ) -> Dict[Tuple[int, int], int]:
    """Tokens src -> dst (fact 1): surplus matched to deficit inside each node, then across nodes,
    both in rank order (two pointers: at most S + D - 1 messages per matching)."""
    c = np.asarray(counts, dtype=np.int64)
    t = np.asarray(targets, dtype=np.int64)
    if c.shape != t.shape or int(c.sum()) != int(t.sum()):
        raise RemapError(f"targets must give every one of the {int(c.sum())} tokens a rank "
                         f"(targets sum to {int(t.sum())})")
    diff = (c - t).tolist()
    flows: Dict[Tuple[int, int], int] = {}

    def match(ranks: Sequence[int]) -> None:
        src = [r for r in ranks if diff[r] > 0]
        dst = [r for r in ranks if diff[r] < 0]
        i = j = 0
        while i < len(src) and j < len(dst):
            s, d = src[i], dst[j]
            n = min(diff[s], -diff[d])
            flows[(s, d)] = flows.get((s, d), 0) + n
            diff[s] -= n
            diff[d] += n
            i += diff[s] == 0
            j += diff[d] == 0

    g = topo.gpus_per_node
    for n in range(len(c) // g):
        match(range(n * g, (n + 1) * g))
    match(range(len(c)))
    return dict(sorted(flows.items()))


def _take_tail(segs: List[Segment], n: int) -> List[Segment]:
    """Remove the last ``n`` tokens of ``segs`` (in place) and return them, in order."""
    tail = []
    while n > 0:
        s = segs.pop()
        size = s.stop - s.start
        if size <= n:
            tail.append(s)
            n -= size
        else:
            cut = s.stop - n
            segs.append(Segment(s.doc, s.start, cut))
            tail.append(Segment(s.doc, cut, s.stop))
            n = 0
    tail.reverse()
    return tail


def remap_flows(counts: Sequence[int], topo: Topology, *, cost=None, capacities: Optional[Sequence[int]] = None
                ) -> Dict[Tuple[int, int], int]:
    """Tokens src -> dst of the remap at minimum cost (facts 1 and 2): what its prediction needs,
    before any segment is cut (``remap_moves``)."""
    return transfer_matrix(counts, balanced_targets(counts, topo, capacities, link_costs(cost)), topo)


def remap_moves(attention_layout: Sequence[Sequence[Segment]], flows: Dict[Tuple[int, int], int]
                ) -> Tuple[Tuple[Tuple[Segment, ...], ...], Tuple[Move, ...]]:
    """(linear layout, moves) carrying ``flows`` (``remap_flows``): each sender gives its tail away,
    the last destination getting the very end (destinations stay in order)."""
    by_src: Dict[int, List[int]] = {}
    for (s, d) in flows:
        by_src.setdefault(s, []).append(d)
    kept: List = list(attention_layout)  # rows stay tuples unless they send or receive
    moves: List[Move] = []
    for src, dsts in by_src.items():
        segs = list(kept[src])
        for dst in reversed(dsts):
            moves.append(Move(src, dst, tuple(_take_tail(segs, flows[(src, dst)]))))
        kept[src] = segs
    moves.sort(key=lambda m: (m.src, m.dst))
    for m in moves:
        if isinstance(kept[m.dst], tuple):
            kept[m.dst] = list(kept[m.dst])
        kept[m.dst].extend(m.segments)
    return tuple(tuple(r) for r in kept), tuple(moves)


def plan_remap(attention_layout: Sequence[Sequence[Segment]], topo: Topology, *, cost=None,
               capacities: Optional[Sequence[int]] = None, tokens: Optional[Sequence[int]] = None
               ) -> Tuple[Tuple[Tuple[Segment, ...], ...], Tuple[Move, ...]]:
    """(linear layout, moves) at minimum remap cost. ``cost``: a CostModel for the NVLink/NIC
    per-token costs (default: NIC 8x NVLink); ``capacities``: per-rank linear-layout token caps
    (caps that sum to the batch's tokens are exact per-rank targets); ``tokens``: the attention
    layout's tokens per rank, when the caller has them (assembly does)."""
    if len(attention_layout) != topo.world_size:
        raise RemapError(f"attention layout has {len(attention_layout)} ranks but the topology has "
                         f"{topo.world_size} ({topo.describe()})")
    counts = list(tokens) if tokens is not None else [segment_tokens(r) for r in attention_layout]
    return remap_moves(attention_layout, remap_flows(counts, topo, cost=cost, capacities=capacities))


# --- what a remap costs (used by predict.py and the tests) ------------------------------------------

def linear_tokens(att_tokens, moves: Sequence[Move]) -> np.ndarray:
    """Per rank tokens of the linear layout: the attention layout's after the remap's moves.

    >>> from megatron_zeppelin.planner.types import Move, Segment
    >>> linear_tokens([6, 2], [Move(0, 1, (Segment(0, 4, 6),))]).tolist()
    [4.0, 4.0]
    """
    out = np.array(att_tokens, dtype=np.float64)
    if moves:  # integers as floats: sums exact in any order
        n = np.array([mv.tokens for mv in moves], dtype=np.float64)
        out -= np.bincount(np.array([mv.src for mv in moves]), n, minlength=len(out))
        out += np.bincount(np.array([mv.dst for mv in moves]), n, minlength=len(out))
    return out


def remap_cost(moves: Sequence[Move], topo: Topology, costs: Tuple[float, float] = DEFAULT_LINK_COSTS) -> float:
    """Transportation cost of ``moves``: tokens x (intra or inter per-token cost)."""
    a, b = costs
    return float(sum(m.tokens * (a if topo.same_node(m.src, m.dst) else b) for m in moves))


def remap_exchanges(layers: int) -> int:
    """Remap all-to-alls in one iteration: to linear and back per layer in the forward, except that
    the last layer stays in the linear layout (vocab head, loss); the backward mirrors each one.

    >>> remap_exchanges(1), remap_exchanges(32)
    (2, 126)
    """
    return 2 * (2 * layers - 1) if layers > 0 else 0


def remap_exchange_s(moves: Sequence[Move], cost) -> List[float]:
    """Seconds of one remap exchange per rank: the busiest of its NVLink port (out or in) and its
    NIC (out or in; a NIC is shared by the GPUs wired to it), plus that link's latency."""
    topo = cost.topology
    w = topo.world_size
    per_tok = cost.hidden_bytes_per_token
    nv_out, nv_in = np.zeros(w), np.zeros(w)
    nic_out, nic_in = np.zeros(topo.num_nics), np.zeros(topo.num_nics)
    on_nic = np.zeros(w, dtype=bool)  # ranks with cross-node moves of their own
    for m in moves:
        nb = m.tokens * per_tok
        if topo.same_node(m.src, m.dst):
            nv_out[m.src] += nb
            nv_in[m.dst] += nb
        else:
            nic_out[topo.nic_of(m.src)] += nb
            nic_in[topo.nic_of(m.dst)] += nb
            on_nic[m.src] = on_nic[m.dst] = True
    out = []
    for r in range(w):
        nv = max(nv_out[r], nv_in[r])
        nic = max(nic_out[topo.nic_of(r)], nic_in[topo.nic_of(r)]) if on_nic[r] else 0.0
        out.append(max(cost.transfer_s(nv, Link.NVLINK), cost.transfer_s(nic, Link.NIC)))
    return out
