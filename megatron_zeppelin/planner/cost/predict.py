"""The planner's prediction of one iteration per rank, from the parts of a Plan.

One layer: QKV projection on the attention layout -> the core attention, the layer program of
program.py (queues inter, intra; the local documents inside the first exchange; the engine's
overlap points and pipelined dK/dV) -> output projection -> remap -> MLP on the linear layout ->
remap back; the backward mirrors it. Every cost comes from the cost model (cost_model.py).

Each rank has a clock (its compute stream). An exchange (a ring step's CommOps, a remap's moves) runs
stage by stage; an op starts when both its ends have posted it, so a rank waits for its ring
partners, the proxies of its routed messages and its remap partners: that waiting is charged as
exposed communication (or remap time), as the runtime pays it. Message time: latency + the busiest
link (NVLink port or NIC) of the op's stage / bandwidth, the links loaded also by the exchanges the
program says fly with it (a backward step's K/V with the previous step's dK/dV).
Every layer starts with all ranks together (the simulator's ``scale`` mode). The DP gradient
all-reduce is the Plan's own term (``Plan.allreduce_s``), not in the per-rank costs.
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

import numpy as np
from typing import Dict, List, Optional, Sequence, Tuple

from megatron_zeppelin.spec.topology import link_ports
from megatron_zeppelin.planner.cost.cost_model import LINEAR_PASSES, CostModel
from megatron_zeppelin.planner.cost.moe_cost import moe_pass_s
from megatron_zeppelin.planner.program import (AttentionWork, Compute, Post, attention_program, local_arrays,
                                               step_chunks, step_schedule)
from megatron_zeppelin.planner.build.remap import linear_tokens
from megatron_zeppelin.planner.types import CommOp, DocPlan, Move, RankCost, Ring, Segment, ring_documents
from megatron_zeppelin.spec.words import MIRROR, Link, Stage




def _link_keys(op: CommOp, cost: CostModel):
    return link_ports(op.link, op.src, op.dst, op.nic, cost.topology)


def step_message_times(ops: Sequence[CommOp], cost: CostModel, scale: float = 1.0) -> Dict[Tuple, float]:
    """Arrival time of every message of one step, all ranks posting at 0, as ``_exchange`` times it
    (routed pieces relayed chunk by chunk): {(ring, block, msg_src, msg_dst): seconds}."""
    hops = [h[:3] + (h[3] * scale,) + h[4:] for h in _op_hops(ops, cost)]
    arrive: Dict[Tuple, float] = {}
    _exchange(hops, defaultdict(float), cost, arrive=arrive)
    return arrive


def _hop(stage, src, dst, nbytes, link, nic, cost, own=(True, True), piece=None):
    """(stage, src, dst, bytes, (out-link key, in-link key), link, own, piece) as the simulator's
    LinkTable keys it; ``own``: (the sender originates the message, the receiver is its
    destination); ``piece``: (message key, start, stop), or None for a one-hop message."""
    return (stage, src, dst, nbytes, link_ports(link, src, dst, nic, cost.topology), link, own, piece)


@lru_cache(maxsize=16)
def _port_table(topo) -> dict:
    """(link, src, dst, nic) -> ``link_ports``, filled as hops ask (a routed schedule's chunks, and
    every candidate placement of a batch, ask for the same few pairs again and again)."""
    return {}


def _op_hops(ops, cost, reverse=False):
    topo = cost.topology
    table = _port_table(topo)
    nvlink = Link.NVLINK  # bound once (spec/words.py): compared per op
    out = []
    for o in ops:  # _hop, its ports looked up
        if not reverse:
            src, dst, nic, stage = o.src, o.dst, o.nic, o.stage
            own, piece = (src == o.msg_src, dst == o.msg_dst), ((o.ring, o.block, o.msg_src, o.msg_dst), o.start, o.stop)
        else:
            src, dst, stage = o.dst, o.src, MIRROR[o.stage]
            nic = -1 if o.link == nvlink else topo.nic_of(src)
            own, piece = (src == o.msg_dst, dst == o.msg_src), ((o.ring, o.block, o.msg_dst, o.msg_src), o.start, o.stop)
        link = o.link
        key = (link, src, dst, nic)
        ports = table.get(key)
        if ports is None:
            ports = table[key] = link_ports(link, src, dst, nic, topo)
        out.append((stage, src, dst, o.nbytes, ports, link, own, piece))
    return out


def _exchange(hops, clock, cost, also=(), prepared=None, arrive=None) -> Dict[int, float]:
    """When each involved rank's wait() on one exchange returns, as distributed/executor.py runs it:
    every rank posts its receives and the sends of the messages it originates at its ``clock``; a
    proxy's relay forwards each piece as soon as it has arrived (in stage order, one after the
    other, in program.py ``step_order``), independent of the proxy's compute. An op starts when its
    sender has the rows, its receiver has posted and the previous chunk of its piece on the same
    hop is through, and takes latency + the busiest link (NVLink port or NIC) of its stage and chunk
    / bandwidth: chunk i+1's dispatch overlaps chunk i's transfer (a pipelined relay). A rank's wait() returns when its own ops are done (sends of messages it originates,
    pieces of messages ending at it): a proxy does not wait for the pieces it relays.
    ``also``: hops of another exchange in flight meanwhile: they load the links, are not timed.
    ``prepared``: ``_prepared_exchange(hops, cost, also)`` when the caller runs the exchange again.
    ``arrive``: filled with each message's arrival at its destination (by the hops' message keys).

    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> cost = toy_context(nodes=2, gpus=2, nics=2).cost
    >>> piece = ((0, 0, 0, 3), 0, 100)  # rows [0, 100) of the message 0 -> 3
    >>> hops = [_hop("dispatch", 0, 1, 10**6, "nvlink", -1, cost, (True, False), piece),  # 0 -> proxy 1
    ...         _hop("transfer", 1, 3, 10**6, "nic", 1, cost, (False, True), piece)]     # proxy 1 -> 3
    >>> done = _exchange(hops, np.array([0.0, 5.0, 0.0, 0.0]), cost)  # the proxy posts at t = 5 s
    >>> bool(done[1] == 5.0 and done[0] > 5.0 and done[3] > done[0])  # the proxy itself waits for nothing
    True
    """
    ranks, rows, secs = _prepared_exchange(hops, cost, also) if prepared is None else prepared
    c = clock.tolist() if isinstance(clock, np.ndarray) else clock
    own: Dict[int, float] = {r: c[r] for r in ranks}
    done: List[float] = []  # per hop in the program's order: when it got through
    relay_post: Dict[int, float] = {}  # per proxy: when its relay posted its last forward
    for (src, dst, lat, src_own, dst_own, came, prev, key), sec in zip(rows, secs):
        t = c[src]
        if came is not None:  # a relayed piece: when it arrived here, after the relay's previous forward
            for p in came:  # the hops that brought its rows here (max: any order gives the same)
                if done[p] > t:
                    t = done[p]
            p = relay_post.get(src)
            if p is not None and p > t:
                t = p
            relay_post[src] = t
        if c[dst] > t:  # (each max as max() takes it: the first unless the next is greater)
            t = c[dst]
        if prev >= 0 and done[prev] > t:  # a piece's chunks go through one hop one after the other
            t = done[prev]
        if sec is not None:
            t = t + lat + sec
        done.append(t)
        if src_own and t > own[src]:
            own[src] = t
        if dst_own and t > own[dst]:
            own[dst] = t
        if key is not None and arrive is not None and t > arrive.get(key, -1.0):
            arrive[key] = t
    return own


def _step_items(hops) -> list:
    """``hops`` as program.py ``step_order`` reads them; a hop without a message (a remap's) is its own."""
    return [(h[0], h[1], h[2], h[7][0], h[7][1], h[7][2], not h[6][0]) if h[7] is not None
            else (h[0], h[1], h[2], ("hop", i), 0, 0, False) for i, h in enumerate(hops)]


def _exchange_parts(hops, cost) -> tuple:
    """What of an exchange depends on its hops alone, not on the clocks nor on the exchanges in flight
    with it (a layer runs the same exchanges every time, the backward some of the forward's again):
    (the ranks of its hops: senders and receivers as first met; its rows; the program's order
    (program.py ``step_order``: phase order, chunks of routed pieces as a pipeline); each hop's
    chunk index; its links' load: (stage, chunk) -> port -> bytes, added in the hops' order; per
    link class (latency, bandwidth)). A row per hop in that order: (src, dst, latency, src owns, dst
    owns, came, prev, message key where dst owns it else None); ``came``: for a relayed hop the
    positions in that order of the earlier hops whose rows, arrived at its sender, contain its own
    (program.py ``step_feeds``), else None; ``prev``: the position of the previous chunk of its
    piece on the same hop, else -1."""
    order, chunk, groups, feeds = step_schedule(_step_items(hops))
    load: Dict[Tuple, Dict] = {}
    for h, c in zip(hops, chunk):
        at = load.get((h[0], c))
        if at is None:
            at = load[(h[0], c)] = defaultdict(float)
        for k in h[4]:  # its ports: two, or four above the NIC level (topology.link_ports)
            at[k] += h[3]
    pos = [0] * len(hops)
    for p, i in enumerate(order):
        pos[i] = p
    prev = [-1] * len(hops)  # a piece's chunks on one hop: one after the other, in the program's order
    for idx in groups.values():
        if len(idx) > 1:
            idx = sorted(idx, key=pos.__getitem__)
            for x, y in zip(idx, idx[1:]):
                prev[y] = pos[x]
    rate = {link: (cost.latency(link), cost.bandwidth(link)) for link in {h[5] for h in hops}}
    rows = []
    for i in order:  # the executor's and the simulator's one order
        _, src, dst, _, _, link, (src_own, dst_own), piece = hops[i]
        came = feeds[i]
        if came is not None:
            p = pos[i]
            came = [pos[j] for j in came if pos[j] < p]
        elif not src_own:
            came = []
        rows.append((src, dst, rate[link][0], src_own, dst_own, came, prev[i],
                     piece[0] if dst_own and piece is not None else None))
    ranks = {}
    for h in hops:
        ranks[h[1]] = ranks[h[2]] = None
    return list(ranks), rows, order, chunk, load, rate


def _prepared_exchange(hops, cost, also=(), parts=None, also_chunks=None) -> Tuple[list, list, list]:
    """What of an exchange does not depend on the clocks, computed once per hop list and exchanges
    in flight with it: (its ranks, its rows: ``_exchange_parts``; per row, the seconds of the
    busiest link's bytes of its stage and chunk, ``also``'s hops loading them too, or None for a copy
    to itself). A link's load is per stage and chunk index: the hops that run together.
    ``parts``: ``_exchange_parts`` of ``hops``, ``also_chunks``: ``step_chunks`` of ``also``'s
    items, where the caller has them."""
    if not hops:
        return [], [], []
    ranks, rows, order, chunk, load, rate = _exchange_parts(hops, cost) if parts is None else parts
    if also:  # (only its links' load, so only its chunks) added after the hops' own, in its order
        load = {k: defaultdict(float, v) for k, v in load.items()}
        for h, c in zip(also, step_chunks(_step_items(also)) if also_chunks is None else also_chunks):
            at = load.get((h[0], c))
            if at is None:
                at = load[(h[0], c)] = defaultdict(float)
            for k in h[4]:
                at[k] += h[3]
    secs = []
    for i in order:
        h = hops[i]
        if h[1] == h[2]:
            secs.append(None)
        else:
            at = load[(h[0], chunk[i])]
            secs.append(max([at[k] for k in h[4]]) / rate[h[5]][1])
    return ranks, rows, secs


class _Attention:
    """The core attention of one layer on every rank (forward or backward), advancing per-rank
    clocks: the layer program (program.py) priced by the cost model and ``_exchange``."""

    def __init__(self, docs, rings, schedule, cost: CostModel, local=None, memo: Optional[dict] = None):
        self.cost, self.world = cost, cost.topology.world_size
        # ``memo`` (PlanContext.exchanges), shared by the candidates of one batch: "hops", [hops, parts,
        # ops] by the ops' ids and reverse (the ops of a routed step are the same objects in every
        # candidate that routes it: routing.py ``route_schedule``, with the same memo; the entry keeps
        # them alive, so their ids stay theirs); "prepared", as ``_prepared_lists`` (ids of the memo's
        # own hop lists).
        # ``_shared`` finds a hops entry from its hops (by id).
        self._memo = memo.setdefault("hops", {}) if memo is not None else None
        self._shared = {}
        local = local_arrays(docs) if local is None else local
        self.work = AttentionWork(cost, docs, rings, self.world, local, schedule)
        self.ops: Dict[Tuple[str, int], List[CommOp]] = defaultdict(list)
        for o in schedule:
            self.ops[(o.queue, o.step)].append(o)
        has_local = len(local[0]) > 0
        self.program = {bw: attention_program(rings, has_local, bw) for bw in (False, True)}
        self._hops: Dict[Tuple[bool, str], list] = {}
        # one hop list per (queue, step, rings, reverse): the forward's K/V exchange runs again in the
        # backward, and a step's dK/dV often goes over the same ops; with its step_schedule by id
        self._lists: Dict[Tuple, list] = {}
        self._parts: Dict[int, tuple] = {}  # _exchange_parts of each, by id (_lists keeps them)
        self._prepared: Dict[Tuple[bool, str], list] = {}  # _prepared_exchange of each Post
        # ... by (id of its hops, id of its also)
        self._prepared_lists: Dict[Tuple[int, int], list] = {} if memo is None else memo.setdefault("prepared", {})
        self._posts = {bw: {x.name: x for x in prog if isinstance(x, Post)} for bw, prog in self.program.items()}
        self.host = cost.host  # a shared CPU host's engine CPU per pass, Post and Wait (None on GPUs)
        self._host_costs: Dict[Tuple[bool, str], Tuple[np.ndarray, np.ndarray]] = {}
        # run()'s results by (pass, starting clocks): the remap variants of one placement start the
        # forward attention at the same clocks (the projections of the same attention layout)
        self._runs: Dict[Tuple[bool, bytes], Tuple[np.ndarray, list]] = {}
        self._least: Dict[bool, Tuple[np.ndarray, np.ndarray]] = {}  # least(): (clock step, compute) per pass

    def hops(self, backward: bool, name: str):
        """The hops of the exchange ``name`` (cached: a layer runs the same program every time)."""
        key = (backward, name)
        if key not in self._hops:
            x = self._posts[backward][name]
            rings = frozenset(x.rings)
            same = (x.queue, x.step, rings, x.reverse)
            if same not in self._lists:
                ops = [o for o in self.ops[(x.queue, x.step)] if o.ring in rings]
                memo_key = (tuple(map(id, ops)), x.reverse) if self._memo is not None else None
                entry = self._memo.get(memo_key) if memo_key is not None else None
                if entry is None:
                    entry = [_op_hops(ops, self.cost, reverse=x.reverse), None, ops]
                    if memo_key is not None:
                        self._memo[memo_key] = entry
                self._lists[same] = entry[0]
                self._shared[id(entry[0])] = entry
            self._hops[key] = self._lists[same]
        return self._hops[key]

    def _parts_of(self, hops) -> tuple:
        """``_exchange_parts`` of one of the layer's hop lists (``_lists`` keeps it, so its id)."""
        got = self._parts.get(id(hops))
        if got is None:
            entry = self._shared.get(id(hops))
            got = entry[1] if entry is not None else None
            if got is None:
                got = _exchange_parts(hops, self.cost)
                if entry is not None:
                    entry[1] = got
            self._parts[id(hops)] = got
        return got

    def _prepare(self, backward: bool, x: Post, hops) -> list:
        """``_prepared_exchange`` of the Post ``x``, once per distinct (hops, exchanges in flight)."""
        shared = [self.hops(backward, n) for n in x.shares]
        also = shared[0] if len(shared) == 1 else [o for h in shared for o in h]
        key = (id(hops), id(also) if len(shared) == 1 else (-1 if not shared else None))
        got = self._prepared_lists.get(key) if key[1] is not None else None
        if got is None:
            chunks = self._parts_of(also)[3] if len(shared) == 1 and also else None
            got = _prepared_exchange(hops, self.cost, also, self._parts_of(hops) if hops else None, chunks)
            if key[1] is not None:
                self._prepared_lists[key] = got
        return got

    def run(self, clock: np.ndarray, backward: bool, busy: np.ndarray) -> None:
        """Advance ``clock`` through the layer's attention program; add compute seconds to ``busy``.

        An exchange is timed when posted (``_exchange``), with the exchanges the program says it
        shares its links with loading them. Backward zigzag ring, compute-bound, per member:
        max(c_0, T) + sum_{s=1}^{G-2} max(c_s, 2T) + max(c_{G-1}, T), then step G-1's dK/dV (T),
        waited at the next queue's overlap point or at the end (tests/unit/test_predict_backward.py).
        """
        key = (backward, clock.tobytes())
        if key in self._runs:  # the same clocks in, the same clocks out; busy gets the same adds
            end, adds = self._runs[key]
            clock[:] = end
            for t in adds:
                busy[:] += t
            return
        adds = []
        done: Dict[str, Dict[int, float]] = {}
        landing: Dict[str, np.ndarray] = {}  # per exchange in flight, the engine's CPU at its Wait, per rank
        host = self.host
        if host is not None:  # the engine packs its own ring rows first (a shared CPU host)
            clock += self.work.pack
        for x in self.program[backward]:
            if isinstance(x, Compute):
                t = self.work.seconds(x, backward)
                clock[:] += t
                busy[:] += t
                adds.append(t)
            elif isinstance(x, Post):
                h = self.hops(backward, x.name)
                if not h:
                    done[x.name], landing[x.name] = {}, None
                    continue
                key = (backward, x.name)
                if key not in self._prepared:
                    self._prepared[key] = self._prepare(backward, x, h)
                land = None
                if host is not None:  # the engine's CPU posting it, on every rank it involves
                    ranks, land = self._host(key, h)
                    clock[ranks] += host.post_s()
                done[x.name] = _exchange(h, clock, self.cost, prepared=self._prepared[key])
                landing[x.name] = land
            else:
                land = landing.pop(x.name)
                for r, t in done.pop(x.name).items():
                    if t > clock[r]:
                        clock[r] = t
                    if land is not None:  # then the engine lands the messages (a shared CPU host)
                        clock[r] += land[r]
        self._runs[key] = (clock.copy(), adds)

    def least(self, clock: np.ndarray, backward: bool, busy: np.ndarray) -> None:
        """run()'s clocks at least, whatever they start at: the pass's packing and compute alone (no
        ring waits, no engine CPU per exchange); ``busy`` gets the same adds (predict least=True)."""
        if backward not in self._least:
            t = [self.work.seconds(x, backward) for x in self.program[backward] if isinstance(x, Compute)]
            step = sum(t) if self.host is None else self.work.pack + sum(t)
            self._least[backward] = (step, sum(t))
        step, compute = self._least[backward]
        clock += step
        busy += compute

    def _host(self, key, hops) -> Tuple[np.ndarray, np.ndarray]:
        """(the ranks an exchange involves: senders and receivers of its hops, proxies included;
        per rank the engine's CPU at its Wait: the host's ``wait_s`` of the bytes of the pieces ending
        there, or None where it costs nothing)."""
        if key not in self._host_costs:
            landed = np.zeros(self.world)
            for h in hops:
                if h[6][1]:  # the receiver is the message's destination: its wait() lands the piece
                    landed[h[2]] += h[3]
            ranks = np.array(sorted({h[1] for h in hops} | {h[2] for h in hops}), dtype=np.int64)
            wait = np.broadcast_to(self.host.wait_s(landed), (self.world,))
            self._host_costs[key] = (ranks, wait if wait.any() else None)
        return self._host_costs[key]


class RingParts(tuple):
    """``ring_costs``'s (attention, exposed) lists, carrying the per-layer attention model for predict."""
    attention: "_Attention"


def ring_costs(docs: Sequence[DocPlan], rings: Sequence[Ring], schedule: Sequence[CommOp], cost: CostModel,
               local=None, memo: Optional[dict] = None) -> Tuple[List[float], List[float]]:
    """Per rank (attention seconds, exposed communication seconds) of one iteration of the core
    attention alone (every rank starting each layer's forward and backward together): what the
    attention layout and the routed schedule cost, before the linear modules and the remap.
    ``local``: ``local_arrays(docs)``, where the caller has it; ``memo``: the batch's exchanges
    (PlanContext.exchanges), which other candidates may have priced already."""
    att = _Attention(docs, rings, schedule, cost, local, memo)
    L, world = cost.model.layers, cost.topology.world_size
    busy, total = np.zeros(world), np.zeros(world)
    att.run(total, False, busy)
    for n, rc in cost.recompute.groups(L):  # per layer; block recompute: each group for its share
        w = n / L  # 1 but under block recompute
        b, clock = (busy if w == 1 else np.zeros(world)), np.zeros(world)
        if rc.has("core_attn"):  # the backward first runs the forward again
            att.run(clock, False, b)
        att.run(clock, True, b)
        if w != 1:
            busy += w * b
            clock *= w
        total += clock
    out = RingParts(((busy * L).tolist(), ((total - busy) * L).tolist()))
    out.attention = att
    return out


def attention_tokens(docs: Sequence[DocPlan], rings: Sequence[Ring], world: int, local=None) -> np.ndarray:
    """Tokens per rank in the attention layout (local documents on their owners, ring members' chunks),
    as floats (exact: integers). ``local``: ``local_arrays(docs)``, where the caller has it."""
    owners, lengths = local_arrays(docs) if local is None else local
    tok = np.bincount(owners, lengths, minlength=world) if len(owners) else np.zeros(world)
    dmap = ring_documents(docs, rings)
    for r in rings:  # member i: chunks i and 2G-1-i of every document of its ring, summed per ring
        if r.docs:
            chunks = np.diff(np.array([dmap[d].bounds for d in r.docs], dtype=np.int64), axis=1).sum(axis=0)
            tok[list(r.ranks)] += chunks[:r.size] + chunks[:r.size - 1:-1]  # integers: exact in any order
    return tok


def predict(docs: Sequence[DocPlan], rings: Sequence[Ring], linear_layout: Sequence[Sequence[Segment]],
            schedule: Sequence[CommOp], moves: Sequence[Move], cost: CostModel, parts=None, att_tokens=None,
            least: bool = False) -> Tuple[RankCost, ...]:
    """Per-rank predicted costs: RankCost(attention, linear (projections on the attention layout, MLP
    and vocab head on the linear layout), exposed ring communication and waiting for partners, remap
    (its transfers and the wait for its partners)); ``total_s`` is when the rank finishes.
    ``parts``: ``ring_costs``'s result when the caller already has it (its attention model is reused);
    ``att_tokens``: the attention layout's tokens per rank when the caller has counted them (the
    linear layout's then follow from the moves).

    ``least``: a lower bound of every rank's ``total_s``, cheaply, by the same program: each core
    attention pass advances a rank by its own compute alone (no ring waits, no engine CPU), and each
    remap hop takes its own bytes at its link's rate (no link shared); every step only adds or takes
    a max, so no clock can run ahead of the exact one (the pick skips a remap variant with it)."""
    world = cost.topology.world_size
    L = cost.model.layers
    att = parts.attention if isinstance(parts, RingParts) else _Attention(docs, rings, schedule, cost)
    if att_tokens is None:
        t_att = attention_tokens(docs, rings, world)
        t_lin = np.array([sum([x.stop - x.start for x in linear_layout[r]]) for r in range(world)], dtype=np.float64)
    else:
        t_att = np.asarray(att_tokens, dtype=np.float64)
        t_lin = linear_tokens(t_att, moves)
    # the linear modules run on each layout's rows: with sequence parallelism padded to a multiple of TP
    r_att = np.asarray(cost.layout_rows(t_att.astype(np.int64)), dtype=np.float64)
    r_lin = np.asarray(cost.layout_rows(t_lin.astype(np.int64)), dtype=np.float64)
    qkv, out, mlp = cost.gemm_s(r_att, "qkv"), cost.gemm_s(r_att, "out"), cost.gemm_s(r_lin, "mlp")  # forward, one layer
    head = LINEAR_PASSES * cost.gemm_s(r_lin, "head")
    mlp_b = 2 * mlp
    if cost.model.is_moe:  # the EP group's sampled expert load and the dispatch/combine all-to-alls
        mlp, mlp_b = moe_pass_s(cost, r_lin), moe_pass_s(cost, r_lin, backward=True)

    # Megatron TP: per layer and pass an all-reduce after attention and after the MLP, or with
    # sequence parallelism an all-gather before and a reduce-scatter after each (cost_model.tp_comm_s)
    tp_ar = cost.tp_comm_s if cost.tp > 1 else _no_tp  # (adding 0.0 or an array of zeros: the same sums)
    # With sequence parallelism each remap first all-gathers its source layout over TP (on the
    # ranks whose layouts differ), in the forward and in the backward
    sp_att = sp_lin = 0.0
    if cost.sp and cost.tp > 1:
        moved = np.zeros(world)
        for mv in moves:
            if mv.tokens:
                moved[mv.src] = moved[mv.dst] = 1.0
        sp_att, sp_lin = cost.sp_allgather_s(r_att) * moved, cost.sp_allgather_s(r_lin) * moved

    attn_busy, lin_busy, remap_t = np.zeros(world), np.zeros(world), np.zeros(world)
    if least:
        remap_f, remap_b = _least_hops(moves, cost) if any(m.tokens for m in moves) else ((), ())
        run_attention, exchange = att.least, _least_exchange
    else:
        remap_f = [_hop(Stage.DIRECT, mv.src, mv.dst, mv.tokens * cost.hidden_bytes_per_token,
                        cost.link_of(mv.src, mv.dst), cost.topology.nic_of(mv.src), cost) for mv in moves if mv.tokens]
        topo = cost.topology
        remap_b = [_hop(Stage.DIRECT, x[2], x[1], x[3], x[5], topo.nic_of(x[2]) if x[5] != Link.NVLINK else -1, cost)
                   for x in remap_f]
        prepared = {id(h): _prepared_exchange(h, cost) for h in (remap_f, remap_b) if h}
        run_attention = att.run

        def exchange(hops, clock):
            for r, t in _exchange(hops, clock, cost, prepared=prepared[id(hops)]).items():
                clock[r] = max(clock[r], t)

    def lin(clock, t):
        clock += t
        lin_busy[:] += t

    def remap(clock, hops):
        if len(hops):
            before = clock.copy()
            exchange(hops, clock)
            remap_t[:] += clock - before

    def forward(c):
        lin(c, qkv)
        run_attention(c, False, attn_busy)
        lin(c, out + tp_ar(t_att) + sp_att)
        remap(c, remap_f)
        lin(c, mlp + tp_ar(t_lin) + sp_lin)
        remap(c, remap_b)

    def backward(c, rc):  # what the backward runs forward again first: rc (spec/recompute.py)
        if rc.full:
            forward(c)
        lin(c, sp_att)
        remap(c, remap_f)
        if rc.has("mlp") and not rc.full:
            lin(c, mlp + tp_ar(t_lin) + sp_lin)
        lin(c, mlp_b + tp_ar(t_lin) + sp_lin)
        remap(c, remap_b)
        lin(c, 2 * out)
        if rc.has("core_attn") and not rc.full:  # a ring-split document's K/V exchanges again
            run_attention(c, False, attn_busy)
        run_attention(c, True, attn_busy)
        lin(c, 2 * qkv + tp_ar(t_att))

    def share(w, run):  # one layer's pass, its clock and busy times weighted by w (its share of layers)
        c = np.zeros(world)
        before = None if w == 1 else (attn_busy.copy(), lin_busy.copy(), remap_t.copy())
        run(c)
        if before is not None:
            for acc, b in zip((attn_busy, lin_busy, remap_t), before):
                acc[:] = b + w * (acc - b)
            c *= w
        return c

    total = np.zeros(world)
    total += share(1, forward)
    for n, rc in cost.recompute.groups(L):  # block recompute: each kind of layer for its share
        total += share(n / L, lambda c, rc=rc: backward(c, rc))
    total = total * L + head
    a, li, rm = attn_busy * L, lin_busy * L + head, remap_t * L
    exp = np.maximum(0.0, total - a - li - rm)
    return tuple(map(RankCost, a.tolist(), li.tolist(), exp.tolist(), rm.tolist()))


def _no_tp(tokens) -> float:
    """Megatron's TP communication without TP: none."""
    return 0.0


def _least_hops(moves: Sequence[Move], cost: CostModel):
    """predict(least=True)'s remap hops, forward and back: (src, dst, latency + own bytes / rate)."""
    mv = [m for m in moves if m.tokens]
    n = len(mv)
    src = np.fromiter((m.src for m in mv), dtype=np.int64, count=n)
    dst = np.fromiter((m.dst for m in mv), dtype=np.int64, count=n)
    tok = np.fromiter((m.tokens for m in mv), dtype=np.float64, count=n)
    g = cost.topology.gpus_per_node
    link = np.full(n, Link.NVLINK, dtype=object)
    for k in np.nonzero(src // g != dst // g)[0].tolist():  # across nodes: the level that holds both
        link[k] = cost.link_of(int(src[k]), int(dst[k]))
    sec = np.empty(n)
    for name in set(link.tolist()):
        at = link == name
        sec[at] = cost.latency(name) + tok[at] * cost.hidden_bytes_per_token / cost.bandwidth(name)
    return (src, dst, sec), (dst, src, sec)


def _least_exchange(hops, clock: np.ndarray) -> None:
    """A remap's clocks at least (predict least=True): each hop starts when both its ends have posted,
    and both wait for it (as ``_exchange`` runs a direct hop, its link alone)."""
    src, dst, sec = hops
    t = np.maximum(clock[src], clock[dst]) + sec
    np.maximum.at(clock, src, t)
    np.maximum.at(clock, dst, t)


def lower_bound(lengths: Sequence[int], cost: CostModel, whole_s: Optional[np.ndarray] = None) -> float:
    """Perfect balance, every document at its own (most efficient) length, all communication hidden.

    Still a lower bound with the split linear work: a rank's iteration time is at least its busy
    time, so the slowest rank takes at least the mean busy time over the ranks. The total busy time
    is at least the sum of each document's attention run whole (splitting only makes blocks smaller
    and the profile's rate grows with length; where the profile has a full-block table, a split's
    full blocks may run faster than the whole causal document, so each document's FLOPs count at the
    faster of its two tables at its length: no sequence of a split has more keys) plus the projections of every token (on the attention
    layout, wherever the token is) plus the MLP and head of every token (on the linear layout):
    proj_s(N) + mlp_s(N) = linear_s(N) whatever the layouts; waiting and exposed transfers only add.
    With TP, every token's activations also go through Megatron's 4 TP all-reduces per layer (2 per
    pass), which run on the critical path whatever the strategy: their bandwidth term is busy time
    too (``predict``'s ``tp_ar`` without its per-call latency); sequence parallelism moves the same
    bytes (an all-gather and a reduce-scatter per all-reduce), its pad rows and remap gathers only add.
    Recompute (``cost.recompute``) adds the forward it runs again, each document whole, the same way.
    ``whole_s``: ``cost.doc_attention_np`` of the lengths, where the caller has it."""
    world = cost.topology.world_size
    arr = np.asarray(lengths, dtype=np.int64)
    n = int(arr.sum())
    L = arr.astype(np.float64)
    full = bool(cost.profile.attn_full_fwd_tflops)  # a split's full blocks may run faster than the whole
    if full:  # every document's FLOPs at the fastest rate a sequence of at most its length runs at
        att = cost.model.layers * float(np.sum(np.where(L > 0, cost.least_flops_s(L) + cost.least_flops_s(L, True)
                                                         + cost.seq_s() + cost.seq_s(True), 0.0)))
    else:
        att = float((cost.doc_attention_np(L) if whole_s is None else whole_s).sum())
    tp_ar = 4 * cost.model.layers * float(cost.tp_allreduce_s(n, latency=False))
    again = 0.0
    for layers, rc in cost.recompute.groups(cost.model.layers):  # block recompute: its layers only
        if rc.has("core_attn"):
            again += layers * float(np.sum(np.where(L > 0, cost.least_flops_s(L) + cost.seq_s(), 0.0) if full
                                           else cost.block_pass_s(L, L, True, False)))
        if rc.has("mlp"):
            again += layers * float(cost.gemm_s(n, "mlp"))
        if rc.full:
            again += layers * float(cost.gemm_s(n, "qkv") + cost.gemm_s(n, "out"))
    return (att + cost.linear_s(n) + tp_ar + again) / world
