"""Zeppelin's hierarchical sequence partitioner: lengths -> classes, node buckets, GPU buckets.

1. Costs and classes. Each document's attention cost comes from the cost model (quadratic, with the
   profile's length-dependent kernel efficiency). A rank's *budget* is the batch's total work over
   the ranks (attention; plus linear time when the remap layer is off, since then tokens stay where
   attention puts them). One piece of work may take at most ``GRANULE`` of a budget: bigger
   documents are split over rings. The class thresholds (thresholds.py) follow from the cost
   model's crossovers: local <= local_max < intra <= intra_max < inter.
2. Ring sizes. An intra document gets the smallest ring (2..gpus_per_node) whose member cost fits
   the granule and whose token share fits the capacity, but never one so large that a ring step
   cannot hide its NVLink transfer (then the largest that hides). Inter documents likewise over
   more than one node (NIC transfer, shared over the node's NICs when routing is on), spread evenly
   over the fewest nodes.
3. Node buckets. Inter rings take the least-loaded nodes (and in each, its least-loaded ranks);
   then every other document, longest first, goes to the node whose predicted per-rank time is
   lowest (LPT). Node time = attention / gpus + the cost of its token imbalance: linear time when
   remap is off, else the cross-node remap of its surplus or deficit (what the remap layer will pay).
4. GPU buckets. Inside each node, intra documents (longest first) run on the ring of the
   least-loaded ranks that have room; local documents go to the least-loaded rank with room (LPT).
   Rank time is the same as node time with the intra-node (NVLink) remap cost. Documents assigned
   to the same ranks share one ring.

Determinism: documents are visited in (-length, index) order and every choice breaks ties by
(load, index), so the decisions depend on the lengths only. Guarantee (tested): for any permutation
of the input, each document lands where a document of the same length landed before; per rank the
multiset of (class, ring ranks, length) is the same, hence the same predicted costs.

Worked example (toy model, 1 node x 4 GPUs): documents of 8000 and 5000 tokens are over local_max,
so they run on intra rings; the short ones go to rank 1, the one whose time they lower most (it holds
the fewest tokens, and the remap layer would otherwise have to bring it some).

>>> from megatron_zeppelin.planner.testing import toy_context
>>> p = plan_zeppelin([8000, 5000, 300, 200, 100, 90], toy_context(nodes=1, gpus=4))
>>> p.thresholds.local_max
3095
>>> [(d.doc, d.cls, d.owner) for d in p.docs]
[(0, 'intra', -1), (1, 'intra', -1), (2, 'local', 1), (3, 'local', 1), (4, 'local', 1), (5, 'local', 1)]
>>> [(r.ranks, r.docs) for r in p.rings]
[((0, 1, 2), (0,)), ((0, 2, 3), (1,))]
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from .bins import Bins
from .context import Placement, PlanContext
from .layout import zigzag_bounds
from .thresholds import inter_share, member_cost_s, zeppelin_thresholds
from .types import DocPlan, PlanError, Ring

# Largest share of a rank's budget one piece of work may be: LPT packing ends within a few percent
# of the mean when pieces are at most half a bin and smaller pieces remain to fill the gaps.
GRANULE = 0.5


def _member_tokens(length: int, ring: int) -> int:
    """Most tokens any zigzag member holds (two chunks of at most ceil(L / 2G))."""
    return 2 * -(-length // (2 * ring))


class _Loads:
    """Per-rank attention seconds and tokens; time = attention + the cost of the token imbalance."""

    def __init__(self, ctx: PlanContext, total_tokens: int):
        topo, cost = ctx.topology, ctx.cost
        self.world, self.g = topo.world_size, topo.gpus_per_node
        self.att = [0.0] * self.world
        self.tok = [0] * self.world
        self.cap = ctx.capacity
        self.remap = ctx.config.remap
        self.lin_rate = cost.linear_s(1)
        self.c_nv = cost.remap_s_per_token("nvlink")
        self.c_x = cost.remap_s_per_token("nic")
        self.mean_rank = total_tokens / self.world
        self.mean_node = total_tokens / topo.nodes

    def rank_time(self, r: int) -> float:
        if self.remap:
            return self.att[r] + self.c_nv * abs(self.tok[r] - self.mean_rank)
        return self.att[r] + self.lin_rate * self.tok[r]

    def node_time(self, att: float, tok: int) -> float:
        if self.remap:
            return (att + self.c_x * abs(tok - self.mean_node)) / self.g
        return (att + self.lin_rate * tok) / self.g

    def least_loaded(self, ranks, count: int, need: int) -> List[int]:
        """The ``count`` least-loaded of ``ranks`` with room for ``need`` more tokens (ties by rank)."""
        ok = [r for r in ranks if self.tok[r] + need <= self.cap]
        if len(ok) < count:
            return []
        return sorted(sorted(ok, key=lambda r: (self.rank_time(r), r))[:count])

    def add(self, r: int, att: float, tok: int) -> None:
        self.att[r] += att
        self.tok[r] += tok


def _ring_sizes(ctx: PlanContext, lengths: np.ndarray, granule: float):
    """Per document: the granule's ring size (node-level estimate), member cost for every size
    2..gpus_per_node, and which sizes fit the capacity and hide the NVLink transfer (vectorised)."""
    cost, g, cap = ctx.cost, ctx.topology.gpus_per_node, ctx.capacity
    n = len(lengths)
    if n == 0 or g < 2:
        z = np.zeros((n, 0))
        return np.zeros(n, dtype=np.int64), z, z.astype(bool)
    sizes = np.arange(2, g + 1)
    Lf = lengths.astype(np.float64)[:, None]
    c = np.maximum(1, lengths[:, None] // (2 * sizes[None, :]))  # [n, sizes] chunk tokens
    full = cost.block_s_np(c, c, False)
    member = 2 * cost.block_s_np(c, c, True) + (2 * sizes[None, :] - 1) * full
    if not ctx.config.remap:
        member = member + cost.linear_s(1) * np.ceil(Lf / sizes[None, :])
    # Hiding: per-step forward compute (2 full blocks, one layer) >= K/V transfer of L/G tokens.
    step_c = 2 * full / cost.model.layers / (1 + _bwd_ratio(cost, c))
    step_t = cost.latency("nvlink") + cost.kv_bytes_per_token * Lf / sizes[None, :] / cost.bandwidth("nvlink")
    hides = step_c >= step_t
    fits = 2 * -(-lengths[:, None] // (2 * sizes[None, :])) <= cap
    out = np.zeros(n, dtype=np.int64)
    for i in range(n):
        ok = fits[i]
        if not ok.any():
            continue  # caller raises the capacity error
        cand = ok & hides[i]
        if not cand.any():  # nothing hides: the smallest ring that fits (least exposed traffic)
            out[i] = sizes[np.argmax(ok)]
            continue
        bal = cand & (member[i] <= granule)
        out[i] = sizes[np.argmax(bal)] if bal.any() else sizes[np.nonzero(cand)[0][-1]]
    # Sizes the GPU level may choose from: those that fit and hide (or the fallback above).
    allowed = (fits & hides) | (sizes[None, :] == out[:, None])
    return out, member, allowed


def _choose_intra(loads: "_Loads", ranks, length: int, member_s, allowed, target: float):
    """(ring size, members) inside one node: the smallest allowed ring whose least-loaded members
    stay within ``target`` seconds, else the one that ends with the least-loaded top member."""
    best = (float("inf"), 0, [])
    for j, ok in enumerate(allowed):
        if not ok:
            continue
        G = j + 2
        members = loads.least_loaded(ranks, G, _member_tokens(length, G))
        if not members:
            continue
        top = max(loads.rank_time(r) for r in members) + float(member_s[j])
        if top <= target:
            return G, members
        if top < best[0]:
            best = (top, G, members)
    return best[1], best[2]


def _bwd_ratio(cost, c):
    """Backward / forward seconds of a block of chunk size ``c`` (to undo block_s's fwd+bwd sum)."""
    return 2.5 * cost.attn_tflops_np(c) / cost.attn_tflops_np(c, True)


def _inter_ring_size(ctx: PlanContext, length: int, granule: float) -> Tuple[int, int]:
    """(nodes, members per node) of an inter ring for one document."""
    topo, cost, cap = ctx.topology, ctx.cost, ctx.capacity
    g, world = topo.gpus_per_node, topo.world_size
    share = inter_share(ctx)
    lo = g + 1
    while lo <= world and _member_tokens(length, lo) > cap:
        lo += 1
    if lo > world:
        raise PlanError(f"document of {length} tokens does not fit {world} ranks of {cap} tokens "
                        "(raise --zeppelin-capacity-tokens or add ranks)")

    def hides(G: int) -> bool:
        return cost.ring_step_compute_s(length, G) >= cost.ring_step_transfer_s(length, G, "nic", share)

    # Smallest balanced size (member cost falls with the ring size): bisection.
    a, b = lo, world
    if member_cost_s(ctx, length, b) > granule:
        a = b
    while a < b:
        m = (a + b) // 2
        if member_cost_s(ctx, length, m) <= granule:
            b = m
        else:
            a = m + 1
    G = a
    if not hides(G):  # shrink towards a size whose steps hide the NIC transfer, not below lo
        while G > lo and not hides(G):
            G -= 1
    # Over the fewest nodes, members spread evenly: every node of the ring sends one NIC hop per
    # step, so fewer nodes means less NIC traffic in all (and fewer rings sharing a node's NICs).
    k = max(2, min(-(-G // g), topo.nodes))
    return k, min(g, -(-G // k))


def plan_zeppelin(lengths: Sequence[int], ctx: PlanContext) -> Placement:
    topo, cost, cfg = ctx.topology, ctx.cost, ctx.config
    world, g, nodes = topo.world_size, topo.gpus_per_node, topo.nodes
    L = np.asarray(lengths, dtype=np.int64)
    n = len(L)
    order = np.lexsort((np.arange(n), -L))  # (-length, index)
    whole = cost.doc_attention_np(L)
    total_tok = int(L.sum())
    work = float(whole.sum()) + (0.0 if cfg.remap else cost.linear_s(total_tok))
    budget = work / world
    granule = GRANULE * budget
    th = zeppelin_thresholds(ctx, granule)
    loads = _Loads(ctx, total_tok)
    ring_of: Dict[int, Tuple[str, Tuple[int, ...]]] = {}  # doc -> (class, member ranks)
    owner: Dict[int, int] = {}

    # --- inter documents: rings over the least-loaded nodes ------------------------------------
    is_inter = L > th.intra_max
    for i in (int(i) for i in order if is_inter[i]):
        Li = int(L[i])
        k, m = _inter_ring_size(ctx, Li, granule)
        node_t = [sum(loads.rank_time(r) for r in topo.node_ranks(v)) for v in range(nodes)]
        need = _member_tokens(Li, k * m)
        members: List[int] = []
        for v in sorted(range(nodes), key=lambda v: (node_t[v], v)):
            pick = loads.least_loaded(topo.node_ranks(v), m, need)
            if pick:
                members.extend(pick)
            if len(members) == k * m:
                break
        if len(members) < k * m:
            raise PlanError(f"document {i} ({Li} tokens) needs {k * m} ranks with room for {need} tokens "
                            f"(raise --zeppelin-capacity-tokens, now {ctx.capacity})")
        members.sort(key=lambda r: (topo.node_of(r), r))  # node by node: one NIC hop per node
        _place_ring(ctx, loads, Li, members)
        ring_of[i] = ("inter", tuple(members))

    # --- node buckets for the rest (LPT on node time) -------------------------------------------
    ring_size = np.zeros(n, dtype=np.int64)
    # Over local_max, or too big for one rank's capacity (split even if it cannot hide).
    is_intra = (~is_inter) & ((L > th.local_max) | (L > ctx.capacity))
    idx_intra = np.nonzero(is_intra)[0]
    ring_size[idx_intra], member, allowed = _ring_sizes(ctx, L[idx_intra], granule)
    row = {int(i): k for k, i in enumerate(idx_intra)}
    est = whole.copy()
    for i in idx_intra:
        if ring_size[i] == 0:
            raise PlanError(f"document {int(i)} ({int(L[i])} tokens) does not fit one node's ranks "
                            f"(raise --zeppelin-capacity-tokens, now {ctx.capacity})")
        G = int(ring_size[i])  # member[] already holds the linear share when remap is off
        est[i] = G * float(member[row[int(i)], G - 2]) - (0.0 if cfg.remap else cost.linear_s(int(L[i])))
    node_att = {v: sum(loads.att[r] for r in topo.node_ranks(v)) for v in range(nodes)}
    node_tok = {v: sum(loads.tok[r] for r in topo.node_ranks(v)) for v in range(nodes)}
    nb = Bins(range(nodes), loads.mean_node, loads.c_x if cfg.remap else loads.lin_rate, cfg.remap,
              node_att, node_tok)
    node_docs: List[List[int]] = [[] for _ in range(nodes)]
    node_cap = g * ctx.capacity
    for i in order[~is_inter[order]].tolist():
        Li = int(L[i])
        v = nb.pick(float(est[i]), Li, lambda v, t: nb.tok[v] + t <= node_cap)
        if v is None:
            raise PlanError(f"document {i} ({Li} tokens) fits no node's remaining capacity "
                            f"(raise --zeppelin-capacity-tokens, now {ctx.capacity})")
        node_docs[v].append(i)
        nb.add(v, float(est[i]), Li)

    # --- GPU buckets inside each node ------------------------------------------------------------
    for v in range(nodes):
        ranks = topo.node_ranks(v)
        docs_v = node_docs[v]
        target = max(budget, nb.att[v] / g)
        for i in docs_v:  # intra documents come first (longer than every local one)
            if not is_intra[i]:
                break
            Li = int(L[i])
            G, members = _choose_intra(loads, ranks, Li, member[row[i]], allowed[row[i]], target)
            if not members:
                raise PlanError(f"document {i} ({Li} tokens) needs {G} ranks of node {v} with room "
                                f"(raise --zeppelin-capacity-tokens, now {ctx.capacity})")
            _place_ring(ctx, loads, Li, members, float(member[row[i], G - 2]))
            ring_of[i] = ("intra", tuple(members))
        rb = Bins(ranks, loads.mean_rank, loads.c_nv if cfg.remap else loads.lin_rate, cfg.remap,
                  {r: loads.att[r] for r in ranks}, {r: loads.tok[r] for r in ranks})
        for i in docs_v:
            if is_intra[i]:
                continue
            Li = int(L[i])
            r = rb.pick(float(whole[i]), Li, lambda r, t: loads.tok[r] + t <= loads.cap)
            if r is None:  # node full (fragmented): any rank of the domain with room
                room = [q for q in range(world) if loads.tok[q] + Li <= loads.cap]
                if not room:
                    raise PlanError(f"document {i} ({Li} tokens) fits no rank "
                                    f"(raise --zeppelin-capacity-tokens, now {ctx.capacity})")
                r = min(room, key=lambda q: (loads.rank_time(q), q))
            else:
                rb.add(r, float(whole[i]), Li)
            loads.add(r, float(whole[i]), Li)
            owner[i] = r
    return _placement(lengths, ctx, order, ring_of, owner, th, budget)


def _place_ring(ctx: PlanContext, loads: _Loads, length: int, members: Sequence[int], att: float = -1.0) -> None:
    G = len(members)
    if att < 0:
        att = ctx.cost.ring_member_attention_s(length, G)
    elif not ctx.config.remap:  # the vectorised member cost includes the linear share; loads add tokens
        att -= ctx.cost.linear_s(-(-length // G))
    b = zigzag_bounds(length, G)
    for j, r in enumerate(members):
        loads.add(r, att, (b[j + 1] - b[j]) + (b[2 * G - j] - b[2 * G - 1 - j]))


def _placement(lengths, ctx, order, ring_of, owner, th, budget) -> Placement:
    """Docs and rings; documents on the same ranks and class share one ring (in visiting order)."""
    ring_id: Dict[Tuple[str, Tuple[int, ...]], int] = {}
    ring_docs: List[List[int]] = []
    for i in order.tolist():
        key = ring_of.get(i)
        if key is not None and key not in ring_id:
            ring_id[key] = len(ring_docs)
            ring_docs.append([])
        if key is not None:
            ring_docs[ring_id[key]].append(i)
    rings = [Ring(id=k, ranks=key[1], cls=key[0], docs=tuple(ring_docs[k])) for key, k in ring_id.items()]
    docs = []
    for i, Li in enumerate(lengths):
        Li = int(Li)
        key = ring_of.get(i)
        if key is None:
            docs.append(DocPlan(i, Li, "local", -1, owner[i], (0, Li)))
        else:
            docs.append(DocPlan(i, Li, key[0], ring_id[key], -1, zigzag_bounds(Li, len(key[1]))))
    nodes = ctx.topology.nodes
    meta = {"budget_s": f"{budget:.6g}", "granule": str(GRANULE)}
    return Placement(docs=docs, rings=rings, thresholds=th, remap=ctx.config.remap,
                     routing=ctx.config.routing_enabled(nodes), meta=meta)
