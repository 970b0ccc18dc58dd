"""One transformer layer of a Plan as a task graph: forward or backward, every rank.

Forward, per rank (design.md "Where Zeppelin sits"): QKV projection (attention-layout tokens) ->
attention queues inter, intra, local -> output projection [-> TP all-reduce] -> remap to the linear
layout -> MLP (linear-layout tokens) [-> TP all-reduce] -> remap back. The backward runs the mirror:
remap back's gradient, MLP, remap, output projection, attention queues (same order: the slowest
communication starts first), QKV projection.

Attention is the layer program (planner/program.py ``attention_program``: the engine's order of
compute, posted exchanges and waits, with its overlap points and the pipelined dK/dV), turned into
tasks: each Compute is a kernel on every rank it involves, each Post a StepExchange of the Plan's
CommOps (executor.run_step, so routed schedules are timed as run), each Wait a join of the rank's
stream with its part of that exchange. On a shared host CPU (``CostModel.host``, the CPU validation's
spec/host.py HostModel; None on GPUs) each pass starts with the engine packing its own ring rows, and
a Post and a Wait also cost each rank of the exchange the engine's CPU (``post_s``, ``wait_s``,
category ``engine``).

Activation recompute (``CostModel.recompute``, from the plan): the backward first reruns the forward
it recomputes, as tasks (category ``recompute``): full, the whole layer's forward; selective
``core_attn``, the attention program's forward (its K/V exchanges again for ring-split documents)
right before the attention backward; ``mlp``, the MLP's forward (and TP all-reduce) before its backward.

Worked example: a 2-member intra ring backward whose compute hides its transfers. Step 0's dK/dV
flies during step 1's compute, so only the last dK/dV exchange (T) is exposed: time = c0 + c1 + T
(not c0 + T + c1 + T as with the dK/dV exchange waited at once).

>>> from megatron_zeppelin.attention.testing import hand_plan
>>> from megatron_zeppelin.planner.testing import toy_context
>>> from megatron_zeppelin.spec.topology import Topology
>>> topo, cost = Topology(1, 2), toy_context(1, 2).cost
>>> plan = hand_plan([8192], topo, [(0, 1)])
>>> k, links, g = LayerCosts(cost), LinkTable(topo, cost.bandwidth("nvlink"), cost.bandwidth("nic")), TaskGraph()
>>> LayerBuilder(plan, k, links, g).attention(backward=True)
>>> c = k.ring_step_s(plan.rings[0], {0: plan.docs[0]})[1]    # [member, step] backward seconds
>>> T = cost.latency("nvlink") + plan.schedule[0].nbytes / cost.bandwidth("nvlink")
>>> bool(c.min() > 2 * T), round(float(g.run(links.capacity).makespan / (c.sum(axis=1).max() + T)), 9)
(True, 1.0)

``remap_point``: ``attention_output`` (design.md: the remap moves the hidden states after the output
projection, so the QKV and output projections run on the attention layout) or ``core_attention``
(a what-if: every projection on the linear layout; q, k, v are remapped into the attention layout
and the attention output back, (heads + 2 kv_heads) x head_dim and heads x head_dim per token).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional

import numpy as np

from megatron_zeppelin.planner.program import AttentionWork, Compute, Post, attention_program
from megatron_zeppelin.planner.types import Plan
from megatron_zeppelin.sim.compute import LayerCosts
from megatron_zeppelin.sim.events import TaskGraph
from megatron_zeppelin.sim.executor import Hop, reverse_hops, run_step
from megatron_zeppelin.sim.network import LinkTable
from megatron_zeppelin.spec.words import Layout, Stage

REMAP_POINTS = ("attention_output", "core_attention")


class LayerBuilder:
    def __init__(self, plan: Plan, costs: LayerCosts, links: LinkTable, g: TaskGraph,
                 tp_comm: bool = True, ring_cache: Optional[dict] = None,
                 remap_point: str = "attention_output"):
        self.plan, self.k, self.links, self.g = plan, costs, links, g
        self.topo = plan.topology
        self.world = plan.world_size
        self.tp_comm = tp_comm
        self.lat = {k: costs.cost.latency(k) for k in costs.cost.link_classes}
        self.docs = {d.doc: d for d in plan.docs}
        self.ops = defaultdict(list)
        for o in plan.schedule:
            self.ops[(o.queue, o.step)].append(o)
        # rows the linear modules run on (sequence parallelism pads each layout to a multiple of TP)
        self.t_att = [costs.cost.layout_rows(plan.tokens(r, Layout.ATTENTION)) for r in range(self.world)]
        self.t_lin = [costs.cost.layout_rows(plan.tokens(r, Layout.LINEAR)) for r in range(self.world)]
        self.mlp_fwd, self.mlp_bwd = costs.mlp_pass_s(self.t_lin)  # MoE: whole EP groups' loads
        if remap_point not in REMAP_POINTS:
            from megatron_zeppelin.errors import ZeppelinError
            raise ZeppelinError(f"unknown remap point '{remap_point}' (set --remap-point to one of {REMAP_POINTS})")
        self.remap_point = remap_point
        m, tp, db = costs.cost.model, costs.cost.tp, costs.cost.model.dtype_bytes
        self.remap_bytes = {"hidden": costs.cost.hidden_bytes_per_token,  # per token, per TP rank
                            "qkv": (max(1, m.heads // tp) + 2 * max(1, m.kv_heads // tp)) * m.head_dim * db,
                            "ctx": max(1, m.heads // tp) * m.head_dim * db}
        self.cursor: List[Optional[int]] = [None] * self.world
        self.recomputing = False  # tasks are the backward's recomputed forward (category "recompute")
        if ring_cache is None or "work" not in ring_cache:  # priced once per plan (shared fwd/bwd)
            work = AttentionWork(costs.cost, plan.docs, plan.rings, self.world, schedule=plan.schedule)
            ring_cache = {} if ring_cache is None else ring_cache
            ring_cache["work"] = work
        self.work = ring_cache["work"]

    # --- helpers -----------------------------------------------------------------------------
    def compute(self, rank: int, seconds: float, cat: str, deps=(), cpu: bool = True) -> int:
        """A kernel on ``rank``'s stream; on a shared host CPU (``links.cpu``) it shares the cores
        with the other ranks' kernels (``cpu=False``: not CPU work, e.g. a TP collective)."""
        res = self.links.cpu(rank) if cpu else None
        deps = [self.cursor[rank], *deps]
        cat = "recompute" if self.recomputing else cat
        if res is None:
            self.cursor[rank] = self.g.delay(seconds, deps, tag=(rank, cat, cat))
        else:
            self.cursor[rank] = self.g.work(seconds, res, deps, tag=(rank, cat, cat))
        return self.cursor[rank]

    def _wait(self, ends: Dict[int, int]):
        """Each rank's compute stream waits for its part of a collective step."""
        for r, e in ends.items():
            self.cursor[r] = self.g.join([self.cursor[r], e])

    def _remap(self, reverse: bool, what: str = "hidden"):
        """Attention layout -> linear layout (``reverse``: back), ``what`` bytes per token moved."""
        nb = self.remap_bytes[what]
        hops = [Hop(Stage.DIRECT, m.src, m.dst, m.tokens * nb, self.k.cost.link_of(m.src, m.dst),
                    self.topo.nic_of(m.src) if not self.topo.same_node(m.src, m.dst) else -1, "remap")
                for m in self.plan.remap if m.tokens]
        if not hops:
            return
        hops = reverse_hops(hops, self.topo) if reverse else hops
        ranks = {h.src for h in hops} | {h.dst for h in hops}
        if self.tp_comm and self.k.cost.sp and what == "hidden":  # SP: gather the source layout over TP first
            for r in sorted(ranks):
                self.compute(r, self.k.sp_allgather_s((self.t_lin if reverse else self.t_att)[r]), "tp_comm", cpu=False)
        self._wait(run_step(self.g, self.links, self.topo, hops, {r: [self.cursor[r]] for r in ranks}, self.lat))

    def _tp(self, tokens: List[int]):
        if self.tp_comm and self.k.cost.tp > 1:
            for r in range(self.world):
                self.compute(r, self.k.tp_allreduce_s(tokens[r]), "tp_comm", cpu=False)

    # --- attention ---------------------------------------------------------------------------
    def _hops(self, ops, scale: float) -> List[Hop]:
        return [Hop(o.stage, o.src, o.dst, o.nbytes * scale, o.link, o.nic, f"ring_{o.queue}",
                    o.msg_src, o.msg_dst, o.start, o.stop, (o.ring, o.block)) for o in ops]

    def _exchange(self, ops, reverse: bool = False, engine=None):
        """Start a StepExchange of ``ops`` on every rank it involves, gated by each rank's stream,
        after the engine's CPU posting it on each (``engine``: a shared host's HostModel, else None):
        (when each rank's part is done, the bytes of the pieces ending at each rank, which its Wait lands)."""
        hops = self._hops(ops, 1.0)
        if reverse:
            hops = reverse_hops(hops, self.topo)
        ranks = sorted({h.src for h in hops} | {h.dst for h in hops})
        if engine is not None and engine.post_s():
            for r in ranks:
                self.compute(r, engine.post_s(), "engine")
        landed: Dict[int, float] = defaultdict(float)
        for h in hops:
            if h.dst == h.target:
                landed[h.dst] += h.nbytes
        return run_step(self.g, self.links, self.topo, hops, {r: [self.cursor[r]] for r in ranks}, self.lat), landed

    def _attention(self, backward: bool):
        """The layer program's attention (planner/program.py), as a task graph."""
        work = self.work
        cost = self.k.cost
        # the engine's CPU per pass, Post and Wait: a shared CPU host's (None on GPUs, and where it costs nothing)
        engine = cost.host if cost.host is not None and cost.host.charges_engine else None
        done: Dict[str, tuple] = {}
        if engine is not None:  # the engine packs its own ring rows first
            for r in np.flatnonzero(work.pack):
                self.compute(int(r), float(work.pack[r]), "engine")
        for x in attention_program(self.plan.rings, bool(work.local_ranks), backward):
            if isinstance(x, Compute):
                t = work.seconds(x, backward)
                for r in work.ranks(x):
                    self.compute(r, float(t[r]), f"attn_{x.queue}")
            elif isinstance(x, Post):
                rings = set(x.rings)
                ops = [o for o in self.ops.get((x.queue, x.step), ()) if o.ring in rings]
                done[x.name] = self._exchange(ops, x.reverse, engine) if ops else ({}, {})
            else:
                ends, landed = done.pop(x.name)
                self._wait(ends)
                if engine is not None:  # then the engine lands the messages
                    for r in sorted(ends):
                        self.compute(r, float(engine.wait_s(landed.get(r, 0.0))), "engine")

    def attention(self, backward: bool = False):
        """Only the core attention (the engine alone), for validation against measured engine runs."""
        self._attention(backward)

    # --- the layer ---------------------------------------------------------------------------
    def forward(self, remap_back: bool = True):
        if self.remap_point == "core_attention":
            return self._forward_core()
        k = self.k
        for r in range(self.world):
            self.compute(r, k.qkv_s(self.t_att[r]), "linear")
        self._attention(False)
        for r in range(self.world):
            self.compute(r, k.out_s(self.t_att[r]), "linear")
        self._tp(self.t_att)
        self._remap(reverse=False)
        self._mlp_forward()
        if remap_back:
            self._remap(reverse=True)

    def _mlp_forward(self):
        for r in range(self.world):
            self.compute(r, self.mlp_fwd[r], "linear")
        self._tp(self.t_lin)

    @staticmethod
    def _again(rc, module: str) -> bool:
        """Whether the backward first runs ``module``'s forward again (selective recompute ``rc``;
        full recompute reruns the whole layer's forward first instead)."""
        return rc.has(module) and not rc.full

    def _recomputed(self, run):
        """Run ``run`` (forward work the backward repeats) with its tasks labelled ``recompute``."""
        self.recomputing = True
        try:
            run()
        finally:
            self.recomputing = False

    def backward(self, remap_back: bool = True, recompute=None):
        """One layer's backward; ``recompute``: this layer's (default the cost model's; block
        recompute differs per layer: sim/iteration.py passes each layer's)."""
        rc = self.k.cost.recompute if recompute is None else recompute
        if self.remap_point == "core_attention":
            return self._backward_core(rc)
        k = self.k
        if rc.full:  # the layer's forward again (its ring exchanges and remaps too)
            self._recomputed(lambda: self.forward(remap_back))
        if remap_back:
            self._remap(reverse=False)  # gradient of "remap back": attention layout -> linear layout
        if self._again(rc, "mlp"):
            self._recomputed(self._mlp_forward)
        for r in range(self.world):
            self.compute(r, self.mlp_bwd[r], "linear")
        self._tp(self.t_lin)
        self._remap(reverse=True)
        for r in range(self.world):
            self.compute(r, 2 * k.out_s(self.t_att[r]), "linear")
        if self._again(rc, "core_attn"):  # a ring-split document repeats its K/V exchanges; a local one none
            self._recomputed(lambda: self._attention(False))
        self._attention(True)
        for r in range(self.world):
            self.compute(r, 2 * k.qkv_s(self.t_att[r]), "linear")
        self._tp(self.t_att)

    # What-if: remap around the core attention only (every projection on the linear layout; q, k, v
    # move to the attention layout, the attention output moves back).
    def _forward_core(self):
        k = self.k
        for r in range(self.world):
            self.compute(r, k.qkv_s(self.t_lin[r]), "linear")
        self._remap(reverse=True, what="qkv")
        self._attention(False)
        self._remap(reverse=False, what="ctx")
        for r in range(self.world):
            self.compute(r, k.out_s(self.t_lin[r]) + k.mlp_s(self.t_lin[r]), "linear")
        self._tp(self.t_lin)
        self._tp(self.t_lin)

    def _backward_core(self, rc):
        k = self.k
        if rc.full:
            self._recomputed(self._forward_core)
        if self._again(rc, "mlp"):
            self._recomputed(lambda: [self.compute(r, k.mlp_s(self.t_lin[r]), "linear") for r in range(self.world)])
        for r in range(self.world):
            self.compute(r, 2 * (k.out_s(self.t_lin[r]) + k.mlp_s(self.t_lin[r])), "linear")
        self._tp(self.t_lin)
        self._remap(reverse=True, what="ctx")
        if self._again(rc, "core_attn"):
            self._recomputed(lambda: self._attention(False))
        self._attention(True)
        self._remap(reverse=False, what="qkv")
        for r in range(self.world):
            self.compute(r, 2 * k.qkv_s(self.t_lin[r]), "linear")
        self._tp(self.t_lin)
