"""Routing layer plan: spread each inter-node ring message over the NICs of its node.

A direct inter-node message leaves on the one NIC wired to ``msg_src``. A routed message is cut into
k pieces of token rows [start, stop): *dispatch* moves a piece over NVLink to a proxy GPU of the
sending node (none when the proxy is ``msg_src``), *transfer* sends it on the proxy's NIC j to a GPU
wired to NIC j of the receiving node (the same rail), *combine* moves it over NVLink into ``msg_dst``
(none when the landing GPU is ``msg_dst``).

Per (queue, step) all NIC messages are routed together: messages below the threshold stay direct
and load their NICs first; the others, largest first, are water-filled over the NIC pairs (out on the
sending node, in on the receiving node) that are least loaded in the step. Ties prefer the sender's
own NIC (no dispatch), then the receiver's (no combine), then NIC indices counted on from the
sender's. Pieces never outnumber NICs, and no piece is smaller than half the threshold.

Threshold (``route_threshold_bytes``): with 2 pieces, one dispatched and one combined, routing costs
2 NVLink latencies and saves n/2 * (1/B_nic - 2/B_nvlink) seconds; it pays from
n* = 4 * lat_nvlink / (1/B_nic - 2/B_nvlink) bytes (never, if NVLink is not twice as fast as a NIC).
``--zeppelin-min-route-bytes`` overrides it when > 0.

Worked example: 2 nodes x 4 GPUs, 4 NICs a node, 10 rows of 8 bytes from rank 3 to rank 4.

>>> from megatron_zeppelin.spec.config import ZeppelinConfig
>>> from megatron_zeppelin.spec.topology import Topology
>>> from megatron_zeppelin.planner.types import CommOp
>>> topo = Topology(2, 4)
>>> op = CommOp("inter", 0, 0, 3, 3, 4, 3, 4, 0, 10, 80, "nic", 3, "direct")
>>> ops = route_schedule([op], topo, None, ZeppelinConfig(min_route_bytes=16))
>>> [(o.stage, o.src, o.dst, o.start, o.stop, o.nic) for o in ops]  # doctest: +NORMALIZE_WHITESPACE
[('dispatch', 3, 0, 3, 6, -1), ('dispatch', 3, 1, 6, 8, -1), ('dispatch', 3, 2, 8, 10, -1),
 ('transfer', 3, 7, 0, 3, 3), ('transfer', 0, 4, 3, 6, 0), ('transfer', 1, 5, 6, 8, 1),
 ('transfer', 2, 6, 8, 10, 2), ('combine', 7, 4, 0, 3, -1), ('combine', 5, 4, 6, 8, -1),
 ('combine', 6, 4, 8, 10, -1)]

Rows 0-2 leave on rank 3's own NIC 3 (no dispatch) and land on rank 7 (NIC 7 = node 1's NIC 3);
rows 3-5 go through proxy rank 0 on NIC 0 to rank 4 itself (no combine). 10 rows over 4 NICs: shares of 3, 3, 2, 2 rows.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.planner.cost.predict import step_message_times
from megatron_zeppelin.planner.program import chunk_cuts
from megatron_zeppelin.planner.types import CommOp
from megatron_zeppelin.spec.words import RING_QUEUES, STAGES, DocClass, Link, Routing, Stage

NEVER = 1 << 62  # threshold when routing can never pay (NVLink not twice a NIC's bandwidth)


def route_threshold_bytes(cost, config=None) -> int:
    """Smallest message worth splitting (bytes); ``config.min_route_bytes`` wins when > 0.

    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> route_threshold_bytes(toy_context().cost)   # 4 * 3us / (1/10 GB/s - 2/100 GB/s)
    150000
    """
    if config is not None and getattr(config, "min_route_bytes", 0) > 0:
        return int(config.min_route_bytes)
    if cost is None:
        raise ValueError("route_threshold_bytes needs a cost model or config.min_route_bytes > 0")
    gain_per_byte = 1.0 / cost.bandwidth(Link.NIC) - 2.0 / cost.bandwidth(Link.NVLINK)
    if gain_per_byte <= 0:
        return NEVER
    return int(math.ceil(round(4.0 * cost.latency(Link.NVLINK) / gain_per_byte, 6)))


def _water_fill(loads: Sequence[float], n: float) -> List[float]:
    """Shares x_j >= 0 summing to n that minimise max(loads_j + x_j)."""
    order = sorted(range(len(loads)), key=lambda j: (loads[j], j))
    total, level = 0.0, 0.0
    for i, j in enumerate(order):
        total += loads[j]
        level = (n + total) / (i + 1)
        nxt = order[i + 1] if i + 1 < len(order) else None
        if nxt is None or level <= loads[nxt]:
            break
    return [max(0.0, level - l) for l in loads]


def _rows_of(shares: Sequence[float], rows: int) -> List[int]:
    """Integer rows proportional to ``shares``, summing to ``rows`` (largest remainder, ties first)."""
    tot = sum(shares)
    exact = [rows * s / tot for s in shares]
    out = [int(math.floor(e)) for e in exact]
    left = rows - sum(out)
    for j in sorted(range(len(shares)), key=lambda j: (-(exact[j] - out[j]), j))[:left]:
        out[j] += 1
    return out


class _StepRouter:
    """Routes the NIC messages of one (queue, step); keeps that step's NIC and NVLink loads."""

    def __init__(self, topo: Topology, threshold: int):
        self.topo, self.threshold = topo, threshold
        self.nic_out: Dict[int, float] = defaultdict(float)  # global NIC id -> bytes sent
        self.nic_in: Dict[int, float] = defaultdict(float)  # global NIC id -> bytes received
        self.nv_in: Dict[int, float] = defaultdict(float)  # proxy rank -> dispatched bytes in
        self.nv_out: Dict[int, float] = defaultdict(float)  # landing rank -> combine bytes out

    def nic(self, node: int, j: int) -> int:
        return node * self.topo.nics_per_node + j

    def add_direct(self, op: CommOp) -> None:
        self.nic_out[op.nic] += op.nbytes
        self.nic_in[self.topo.nic_of(op.dst)] += op.nbytes

    def _gpus_on(self, node: int, j: int) -> Tuple[int, ...]:
        return _nic_ranks(self.topo)[self.nic(node, j)]

    def route(self, op: CommOp) -> List[CommOp]:
        topo, nics = self.topo, self.topo.nics_per_node
        a, b = topo.node_of(op.msg_src), topo.node_of(op.msg_dst)
        j_src = topo.gpu_to_nic[topo.local_of(op.msg_src)]
        j_dst = topo.gpu_to_nic[topo.local_of(op.msg_dst)]
        usable = [j for j in range(nics) if self._gpus_on(a, j) and self._gpus_on(b, j)]
        load = {j: max(self.nic_out[self.nic(a, j)], self.nic_in[self.nic(b, j)]) for j in usable}
        pref = {j: (load[j], 0 if j == j_src else 1 if j == j_dst else 2, (j - j_src) % nics) for j in usable}
        rows = op.stop - op.start
        min_piece = max(1.0, self.threshold / 2.0)
        k = int(min(len(usable), rows, max(1, op.nbytes // min_piece)))
        chosen = sorted(usable, key=lambda j: pref[j])[:k]
        while True:  # water-fill; drop the NIC with the smallest piece while a piece is too small
            shares = _water_fill([load[j] for j in chosen], float(op.nbytes))
            small = [i for i, x in enumerate(shares) if x < min_piece]
            if len(chosen) == 1 or not small:
                break
            del chosen[min(small, key=lambda i: (shares[i], -i))]
        if len(chosen) == 1 and chosen[0] == j_src:  # one piece on the sender's own NIC: stay direct
            self.add_direct(op)
            return [op]
        per_row = op.nbytes // rows
        counts = _rows_of(shares, rows)
        pieces = sorted(((j, c) for j, c in zip(chosen, counts) if c > 0), key=lambda p: (p[0] - j_src) % nics)
        out, start = [], op.start
        for j, c in pieces:
            stop = start + c
            nb = c * per_row
            proxy = self._proxy(op.msg_src, a, j)
            land = self._landing(op.msg_dst, proxy, b, j)
            self.nic_out[self.nic(a, j)] += nb
            self.nic_in[self.nic(b, j)] += nb
            if proxy != op.msg_src:
                self.nv_in[proxy] += nb
                out.append(_hop_of(op, op.msg_src, proxy, start, stop, nb, Link.NVLINK, -1, Stage.DISPATCH))
            out.append(_hop_of(op, proxy, land, start, stop, nb, op.link, self.nic(a, j), Stage.TRANSFER))
            if land != op.msg_dst:
                self.nv_out[land] += nb
                out.append(_hop_of(op, land, op.msg_dst, start, stop, nb, Link.NVLINK, -1, Stage.COMBINE))
            start = stop
        return out

    def _proxy(self, src: int, node: int, j: int) -> int:
        gpus = self._gpus_on(node, j)
        if src in gpus:
            return src
        return min(gpus, key=lambda r: (self.nv_in[r], r))

    def _landing(self, dst: int, proxy: int, node: int, j: int) -> int:
        gpus = self._gpus_on(node, j)
        if dst in gpus:
            return dst
        twin = node * self.topo.gpus_per_node + self.topo.local_of(proxy)  # same local index: same rail
        if twin in gpus:
            return twin
        return min(gpus, key=lambda r: (self.nv_out[r], r))


@lru_cache(maxsize=16)
def _nic_ranks(topo: Topology) -> Tuple[Tuple[int, ...], ...]:
    """``topo.nic_ranks`` of every global NIC, once per topology (the router asks per piece)."""
    return tuple(topo.nic_ranks(n) for n in range(topo.nodes * topo.nics_per_node))


def _hop_of(op: CommOp, src: int, dst: int, start: int, stop: int, nbytes: int, link, nic: int, stage) -> CommOp:
    """A hop of ``op``'s message (its queue, step, ring, block and ends): ``dataclasses.replace``
    without its field-by-field look-up (a routed schedule makes one per chunk of every piece)."""
    return CommOp(op.queue, op.step, op.ring, op.block, op.msg_src, op.msg_dst, src, dst, start, stop, nbytes,
                  link, nic, stage)


def relay_chunk_bytes(cost, config=None) -> int:
    """Largest chunk of a routed piece (bytes; 0: pieces are not cut): ``config.relay_chunk_bytes``
    when set (``--zeppelin-relay-chunk-bytes``), else the profile's ``relay_chunk_bytes``; 0 without either.

    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> relay_chunk_bytes(toy_context().cost), relay_chunk_bytes(None, ZeppelinConfig(relay_chunk_bytes=0))
    (2097152, 0)
    """
    if config is not None and getattr(config, "relay_chunk_bytes", None) is not None:
        return int(config.relay_chunk_bytes)
    return int(cost.profile.relay_chunk_bytes) if cost is not None else 0


def route_schedule(ops: Sequence[CommOp], topo: Topology, cost, config, memo: Optional[dict] = None) -> List[CommOp]:
    """Replace direct inter-node ('nic') ops by dispatch/transfer/combine chains (see module doc),
    each piece cut into chunks of at most ``relay_chunk_bytes`` (program.py ``chunk_cuts``: every
    stage of a piece the same rows, so chunk i+1's dispatch can run with chunk i's transfer).

    The result does not depend on the input order: steps come in queue order (inter, intra), then
    step; within a step ops are sorted by STAGES, then message (ring, block, msg_src, msg_dst), then rows. ``config.routing == 'off'`` returns ``ops`` unchanged.

    ``memo``: the batch's (PlanContext.exchanges), where a step with pieces to spread is routed once
    for every candidate that has it (a step's routing reads its own ops alone: a placement and its
    +a2a version share their inter rings); its routed ops are then the same objects in each.
    """
    if config is not None and getattr(config, "routing", "auto") == "off":
        return list(ops)
    threshold = route_threshold_bytes(cost, config)
    chunk = relay_chunk_bytes(cost, config)
    groups: Dict[Tuple[str, int], List[CommOp]] = defaultdict(list)
    for o in ops:
        groups[(o.queue, o.step)].append(o)
    out: List[CommOp] = []
    routes = memo.setdefault("routes", {}) if memo is not None else None
    for k in sorted(groups, key=lambda k: (RING_QUEUES.index(k[0]) if k[0] in RING_QUEUES else len(RING_QUEUES), k)):
        step_ops = tuple(groups[k])
        if routes is None or not any(_spreads(o, topo, threshold) for o in step_ops):
            # nothing to spread: sorting it costs less than finding it
            out.extend(_route_step(step_ops, topo, threshold, chunk))
            continue
        key = (step_ops, threshold, chunk)
        got = routes.get(key)
        if got is None:
            got = routes[key] = _route_step(step_ops, topo, threshold, chunk)
        out.extend(got)
    return out


_STAGE_RANK = {st: i for i, st in enumerate(STAGES)}  # STAGES.index, looked up


def _spreads(o: CommOp, topo: Topology, threshold: int) -> bool:
    """Whether ``route_schedule`` splits ``o`` over the node's NICs: a direct network message of at
    least ``threshold`` bytes and two rows, on nodes with more than one NIC."""
    return (o.link != Link.NVLINK and o.stage == Stage.DIRECT and o.nbytes >= threshold and o.stop - o.start >= 2
            and topo.nics_per_node > 1)


def _route_step(step_ops: Tuple[CommOp, ...], topo: Topology, threshold: int, chunk: int) -> Tuple[CommOp, ...]:
    """One step's ops routed (``route_schedule``)."""
    nvlink, direct = Link.NVLINK, Stage.DIRECT  # bound once (spec/words.py): compared per op
    stage_rank = _STAGE_RANK
    router = _StepRouter(topo, threshold)
    routed: List[CommOp] = []
    big: List[CommOp] = []
    for o in step_ops:
        if o.link == nvlink or o.stage != direct:  # any network level's hop is routed
            routed.append(o)
        elif _spreads(o, topo, threshold):
            big.append(o)
        else:  # too small to split: stays direct and loads its NICs before the big ones are spread
            router.add_direct(o)
            routed.append(o)
    for o in sorted(big, key=lambda o: (-o.nbytes, o.ring, o.block, o.msg_src, o.msg_dst)):
        for x in router.route(o):  # each piece's hops cut the same way into chunks (a pipeline)
            if x.stage == direct:
                routed.append(x)
                continue
            per_row = x.nbytes // max(1, x.stop - x.start)
            routed.extend(_hop_of(x, x.src, x.dst, a, b, (b - a) * per_row, x.link, x.nic, x.stage)
                          for a, b in chunk_cuts(x.start, x.stop, per_row, chunk))
    routed.sort(key=lambda o: (stage_rank[o.stage], o.ring, o.block, o.msg_src, o.msg_dst, o.start))
    return tuple(routed)


def nic_bytes(ops: Sequence[CommOp], topo: Topology, direction: str = "out") -> Dict[int, int]:
    """Bytes each global NIC sends (``out``) or receives (``in``) in ``ops`` (one step: per-NIC share).

    >>> from megatron_zeppelin.planner.types import CommOp
    >>> op = CommOp("inter", 0, 0, 0, 1, 2, 1, 2, 0, 4, 40, "nic", 0, "transfer")
    >>> nic_bytes([op], Topology(2, 2, 1)), nic_bytes([op], Topology(2, 2, 1), "in")
    ({0: 40}, {1: 40})
    """
    out: Dict[int, int] = defaultdict(int)
    for o in ops:
        if o.link != Link.NVLINK:  # a NIC carries every network level's hop
            out[o.nic if direction == "out" else topo.nic_of(o.dst)] += o.nbytes
    return dict(sorted(out.items()))


def explain_step(cost, topo: Topology, nbytes: int, config=None) -> dict:
    """Direct vs routed predicted time of one inter-node ring message of ``nbytes`` (one layer, forward),
    routed before pipelining (each piece whole: dispatch, then transfer, then combine) and after
    (each piece cut into chunks of ``relay_chunk_bytes``, the stages overlapped).

    The message is the ring hop that leaves a node: last GPU of node 0 -> first GPU of node 1 (with
    one node, a second like it is assumed), on otherwise idle NICs; times follow predict.py's model
    (``step_message_times``: per chunk and stage, latency + busiest link's bytes / bandwidth; a relay
    forwards what has arrived). ``stages_s``: each stage of the unpipelined route alone.

    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> ctx = toy_context(nodes=2, gpus=4, nics=2)
    >>> e = explain_step(ctx.cost, ctx.topology, 32 << 20)   # two pieces of 16 MiB, chunks of 2 MiB
    >>> e["pieces"], e["nics_used"], e["chunks"], e["routed_s"] < e["unpipelined_s"] < e["direct_s"]
    (2, 2, 8, True)
    """
    if config is None:
        config = ZeppelinConfig()
    config = replace(config, routing=Routing.MULTI_NIC)
    t2 = topo if topo.nodes >= 2 else Topology(2, topo.gpus_per_node, topo.nics_per_node, topo.gpu_to_nic)
    cost2 = replace(cost, topology=t2)
    kvb = max(1, int(cost.kv_bytes_per_token))
    rows = max(1, -(-int(nbytes) // kvb))
    src, dst = t2.gpus_per_node - 1, t2.gpus_per_node
    op = CommOp(DocClass.INTER, 0, 0, 0, src, dst, src, dst, 0, rows, rows * kvb, Link.NIC, t2.nic_of(src), Stage.DIRECT)
    chunk = relay_chunk_bytes(cost2, config)
    whole = route_schedule([op], t2, cost2, replace(config, relay_chunk_bytes=0))
    routed = route_schedule([op], t2, cost2, replace(config, relay_chunk_bytes=chunk))
    key = (0, 0, src, dst)
    direct_s = step_message_times([op], cost2)[key]
    unpipelined_s = step_message_times(whole, cost2)[key]
    routed_s = step_message_times(routed, cost2)[key]
    stages = {}
    for st in STAGES:  # each stage alone: its hops as one-hop messages, the slowest
        hops = [replace(o, msg_src=o.src, msg_dst=o.dst) for o in whole if o.stage == st]
        if hops:
            stages[st] = max(step_message_times(hops, cost2).values())
    transfers = [o for o in whole if o.link == Link.NIC]
    pieces = [{"nic": o.nic, "proxy": o.src, "landing": o.dst, "rows": o.stop - o.start, "bytes": o.nbytes}
              for o in transfers]
    per_piece = max(sum(1 for o in routed if o.link == Link.NIC and o.nic == t.nic) for t in transfers)
    threshold = route_threshold_bytes(cost2, config)
    p = cost.profile
    text = (f"{p.name}: {t2.gpus_per_node} GPUs and {t2.nics_per_node} NICs per node; one ring message of "
            f"{rows * kvb / 1e6:.2f} MB ({rows} tokens x {kvb} B) from rank {src} to rank {dst}: "
            f"direct on NIC {op.nic} {direct_s * 1e3:.3f} ms; routed over {len(transfers)} NIC(s) "
            f"{sorted({o.nic for o in transfers})} {unpipelined_s * 1e3:.3f} ms unpipelined ("
            + ", ".join(f"{st} {t * 1e3:.3f} ms" for st, t in stages.items())
            + f", one after the other), x{direct_s / unpipelined_s:.2f}; messages under {threshold} B stay direct"
            + (f"\n  pipelined relays: pieces cut into {per_piece} chunk(s) of <= {chunk} B "
               f"(--zeppelin-relay-chunk-bytes): routed {routed_s * 1e3:.3f} ms, x{direct_s / routed_s:.2f} "
               f"vs direct, x{unpipelined_s / routed_s:.2f} vs unpipelined" if chunk else
               "\n  pipelined relays off (--zeppelin-relay-chunk-bytes 0)"))
    return {"cluster": p.name, "nbytes": rows * kvb, "rows": rows, "src": src, "dst": dst,
            "direct_s": direct_s, "routed_s": routed_s, "unpipelined_s": unpipelined_s,
            "speedup": direct_s / routed_s, "chunk_bytes": chunk, "chunks": per_piece,
            "stages_s": stages, "pieces": len(transfers), "nics_used": len({o.nic for o in transfers}),
            "piece_detail": pieces, "threshold_bytes": threshold, "text": text}
