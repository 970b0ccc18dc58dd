"""AttentionEngine: this rank's share of a Plan's core attention, forward and backward.

    engine = AttentionEngine(plan, rank, group)
    out = engine(q, k, v)   # q [t, heads, d], k/v [t, kv_heads, d], t = plan.tokens(rank)

Rows are this rank's attention-layout segments concatenated. The result equals per-document causal
attention run on each whole document alone (reference.py), and is differentiable. The order of the
work is the layer program (planner/program.py, the same one the prediction prices and the simulator
times), run by runner.py: queues inter, then intra (a2a rings of a queue first, then all-gather
rings, then zigzag p2p rings), the local documents while the first transfer of the first queue is
in flight, the pipelined dK/dV. An a2a (Ulysses) ring's head-sharded Q/K/V, output and
log-sum-exp are kept from the forward for the backward (ulysses.py), as TE keeps them. Every rank runs every queue step (proxies of routed messages included).
``counters`` (CommCounters) accumulate bytes per link/NIC/step and compute seconds per queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Set, Tuple

import torch
import torch.distributed as dist

from megatron_zeppelin.distributed.counters import CommCounters
from megatron_zeppelin.distributed.tags import ExchangeTags
from megatron_zeppelin.planner.program import attention_program
from megatron_zeppelin.planner.types import CommOp, Plan, PlanError, Ring
from megatron_zeppelin.attention.kernels import attend_pairs, attend_pairs_backward
from megatron_zeppelin.attention.runner import LayerRun
from megatron_zeppelin.attention.ulysses import Heads
from megatron_zeppelin.attention.view import RankView
from megatron_zeppelin.spec.words import DocClass



@dataclass(frozen=True)
class RingContext:
    """What the program runner (runner.py) reads for one engine call: this rank's view
    of the plan, its rings and schedule, the group and its tag sequence, the counters and the kernel
    settings."""
    rank: int
    group: object
    tags: ExchangeTags
    view: RankView
    rings: Tuple[Ring, ...]
    ops: Mapping[Tuple[str, int], Tuple[CommOp, ...]]  # the schedule by (queue, step)
    counters: CommCounters
    scale: float
    backend: str

    def step_ops(self, queue: str, step: int, rings: Set[int]) -> List[CommOp]:
        """The ops of (``queue``, ``step``) of the given ring ids, in schedule order."""
        return [o for o in self.ops.get((queue, step), ()) if o.ring in rings]


class AttentionEngine:
    def __init__(self, plan: Plan, rank: int, group, *, groups=None, softmax_scale: Optional[float] = None,
                 counters: Optional[CommCounters] = None, backend: str = "auto",
                 tags: Optional[ExchangeTags] = None):
        if not 0 <= rank < plan.world_size:
            raise PlanError(f"rank {rank} is outside the plan's domain of {plan.world_size} ranks "
                            "(pass the domain group's rank)")
        if group is not None and dist.is_initialized() and dist.get_world_size(group) != plan.world_size:
            raise PlanError(f"the domain group has {dist.get_world_size(group)} ranks but the plan was made "
                            f"for {plan.world_size} ({plan.topology.describe()}): check --zeppelin-gpus-per-node "
                            "and the domain (DP x CP) size")
        self.plan, self.rank, self.group, self.groups = plan, rank, group, groups
        self.scale_override = softmax_scale
        self.counters = counters if counters is not None else CommCounters()
        self.backend = backend
        # The group's tag sequence: a caller keeping exchanges on the group beyond this engine passes
        # (and drains) its own; else the engine owns one and drains it when each pass ends, so that no
        # relay of this engine can meet the messages of the next engine on the group.
        self.tags, self._owns_tags = (tags, False) if tags is not None else (ExchangeTags(), True)
        self.view = RankView.build(plan.docs, plan.rings, plan.attention_layout, rank)
        self._ops: Dict[Tuple[str, int], Tuple[CommOp, ...]] = {}
        for o in plan.schedule:
            self._ops.setdefault((o.queue, o.step), ())
            self._ops[(o.queue, o.step)] += (o,)
        self.scale = 1.0
        has_local = any(d.cls == DocClass.LOCAL for d in plan.docs)  # the plan's, not this rank's: one program
        self.program = {bw: attention_program(plan.rings, has_local, bw, plan.schedule) for bw in (False, True)}

    def context(self) -> RingContext:
        return RingContext(self.rank, self.group, self.tags, self.view, self.plan.rings, self._ops, self.counters,
                           self.scale, self.backend)

    # --- validation -----------------------------------------------------------------------
    def _check(self, q, k, v) -> None:
        t = self.view.tokens
        if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
            raise PlanError(f"q, k, v must be [tokens, heads, head_dim]; got shapes {tuple(q.shape)}, "
                            f"{tuple(k.shape)}, {tuple(v.shape)}")
        if q.shape[0] != t or k.shape[0] != t or v.shape[0] != t:
            raise PlanError(f"rank {self.rank}: the plan gives this rank {t} attention-layout tokens but q, k, v "
                            f"have {q.shape[0]}, {k.shape[0]}, {v.shape[0]} (was the batch built from the same plan?)")
        if k.shape != v.shape:
            raise PlanError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
        if q.shape[2] != k.shape[2] or k.shape[1] == 0 or q.shape[1] % k.shape[1]:
            raise PlanError(f"q heads/head_dim {tuple(q.shape[1:])} do not fit k/v {tuple(k.shape[1:])}: "
                            "heads must be a multiple of kv_heads and head_dim equal")
        if q.dtype != k.dtype or q.dtype != v.dtype or q.device != k.device or q.device != v.device:
            raise PlanError("q, k, v must share dtype and device")

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self._check(q, k, v)
        self.scale = self.scale_override if self.scale_override is not None else q.shape[2] ** -0.5
        return _EngineFunction.apply(self, q, k, v)

    # --- forward / backward -------------------------------------------------------------------
    def _local_forward(self, q, k, v, out, lse):
        with self.counters.timer(DocClass.LOCAL):  # all local documents in one causal varlen call
            attend_pairs(q, k, v, self._local_pairs(), out, lse, self.scale, self.backend)

    def _local_backward(self, q, k, v, out, lse, dout, dq, dk, dv):
        with self.counters.timer(DocClass.LOCAL):
            attend_pairs_backward(dout, q, k, v, out, lse, self._local_pairs(), dq, dk, dv, self.scale, self.backend)

    def _local_pairs(self):
        rows = [slice(self.view.offset[s], self.view.offset[s] + len(s)) for s in self.view.local]
        return [(r, r, 0) for r in rows]

    def _end_pass(self) -> None:
        if self._owns_tags:
            self.tags.drain()

    def forward(self, q, k, v):
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        out = torch.zeros(q.shape, dtype=acc, device=q.device)
        lse = torch.full(q.shape[:2], float("-inf"), dtype=acc, device=q.device)
        run = LayerRun(self.context(), q, k, v, out, lse, lambda: self._local_forward(q, k, v, out, lse))
        run.run(self.program[False])
        self._end_pass()
        return out.to(q.dtype), lse, run.heads

    def backward(self, q, k, v, out, lse, dout, heads=None):
        """``heads``: what the forward kept for its a2a rings (its third result)."""
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dk = torch.zeros(k.shape, dtype=acc, device=q.device)
        dv = torch.zeros(v.shape, dtype=acc, device=q.device)
        dout = dout.to(q.dtype)
        LayerRun(self.context(), q, k, v, out, lse, lambda: self._local_backward(q, k, v, out, lse, dout, dq, dk, dv),
                 grads=(dout, dq, dk, dv), heads=heads).run(self.program[True])
        self._end_pass()
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _EngineFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, engine: AttentionEngine, q, k, v):
        out, lse, heads = engine.forward(q.detach(), k.detach(), v.detach())
        ctx.engine, ctx.a2a = engine, tuple(heads)  # a2a rings' head groups, saved as TE saves them
        ctx.save_for_backward(q, k, v, out, lse, *(t for rid in ctx.a2a for t in heads[rid].tensors()))
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, *kept = ctx.saved_tensors
        heads = {rid: Heads(*kept[5 * n:5 * n + 5]) for n, rid in enumerate(ctx.a2a)}
        dq, dk, dv = ctx.engine.backward(q.detach(), k.detach(), v.detach(), out, lse, dout, heads)
        return None, dq, dk, dv


def verify_plan(plan: Plan, group=None) -> None:
    """Compare plan digests across the domain; on a mismatch every rank raises (no rank is left
    waiting): ranks whose plan differs from group rank 0's name the first differing field."""
    if not dist.is_initialized():
        return
    world = dist.get_world_size(group)
    mine = torch.tensor(list(bytes.fromhex(plan.digest())), dtype=torch.uint8)  # 8 bytes
    allg = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(allg, mine, group=group)
    digests = [bytes(t.tolist()).hex() for t in allg]
    if len(set(digests)) == 1:
        return
    obj = [plan.to_json() if dist.get_rank(group) == 0 else None]
    dist.broadcast_object_list(obj, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    bad = [r for r, d in enumerate(digests) if d != digests[0]]
    me = dist.get_rank(group)
    if me in bad:
        where = Plan.from_json(obj[0]).first_difference(plan)
        raise PlanError(f"rank {me}: plan digest {digests[me]} differs from rank 0's {digests[0]}; "
                        f"first difference at {where}. Every rank must plan from the same lengths, "
                        "topology, profile and config (check --zeppelin-* flags and the data order)")
    raise PlanError(f"rank {me}: plan digests differ across the domain (ranks {bad} disagree with rank 0); "
                    "every rank must plan from the same lengths, topology, profile and config")
