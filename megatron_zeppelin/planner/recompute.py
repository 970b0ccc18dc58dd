"""What activation recompute costs: the forward work it runs again during the backward, per rank.

Megatron's ``--recompute-granularity selective`` reruns the forward of the modules named by
``--recompute-modules`` (core_attn by default), ``full`` reruns each layer's whole forward; the
memory each saves is in dp/memory.py (Recompute). Charged per rank, per iteration (all layers):

- core_attn (and full): the core attention's forward again, with the ring communication of a
  ring-split document's forward (its K/V passes: the forward third of the exposed ring time, as the
  backward passes K/V and dK/dV). A local document repeats no communication;
- mlp (and full): the MLP's forward (a third of its forward + backward GEMM time), on the linear layout;
- layernorm: elementwise and memory-bound, not in the cost model (charged nothing);
- full also: the QKV/output projections' forward and the remap's forward all-to-alls (half its time).

This is a term added to a plan's prediction (``predicted_with_recompute``); the simulator takes it
as the same per-rank time added to its backward (sim/runs.py: the iteration grows by the busiest
rank's recompute, an upper bound since ranks synchronise at layer boundaries). Where the
one-layer program (i15's engine/predict refactor) lands, this term belongs in its backward step
list: a recompute step before each layer's backward, running the forward steps of the recomputed
modules, ring exchanges included.

>>> from megatron_zeppelin.planner.testing import toy_context
>>> from megatron_zeppelin.planner import plan_batch
>>> ctx = toy_context(gpus=4)
>>> plan = plan_batch([4000, 300, 200], ctx.topology, ctx.profile, ctx.model, ctx.config, strategy="static_cp")
>>> none, core, full = (recompute_s(plan, ctx.cost, rc) for rc in ("none", "selective:core_attn", "full"))
>>> max(none), all(0 < c <= f for c, f in zip(core, full))
(0.0, True)
"""

from __future__ import annotations

from typing import List

from .cost_model import BWD_FLOPS, LINEAR_PASSES, CostModel

RING_FORWARD_SHARE = 1.0 / 3.0  # forward ring traffic (K/V) of forward + backward (K/V, dK/dV)


def recompute_s(plan, cost: CostModel, recompute) -> List[float]:
    """Per rank, the seconds ``recompute`` adds to one iteration of ``plan``."""
    from ..dp.memory import Recompute
    rc = Recompute.parse(recompute)
    world = len(plan.attention_layout)
    if rc.granularity == "none" or not (rc.has("core_attn") or rc.has("mlp")):
        return [0.0] * world
    m = cost.model
    gemm = cost.profile.gemm_tflops * 1e12
    out = []
    for r in range(world):
        c = plan.cost[r]
        att_tok = sum(s.stop - s.start for s in plan.attention_layout[r])
        lin_tok = sum(s.stop - s.start for s in plan.linear_layout[r])
        t = 0.0
        if rc.has("core_attn"):
            t += c.attention_s / (1.0 + BWD_FLOPS) + RING_FORWARD_SHARE * c.comm_exposed_s
        if rc.has("mlp"):
            head = LINEAR_PASSES * lin_tok * m.head_flops_per_token(cost.tp) / gemm
            t += (cost.mlp_s(lin_tok) - head) / LINEAR_PASSES
        if rc.granularity == "full":
            t += cost.proj_s(att_tok) / LINEAR_PASSES + 0.5 * c.remap_s
        out.append(t)
    return out


def predicted_with_recompute(plan, cost: CostModel, recompute) -> float:
    """The plan's predicted iteration (busiest rank) with the recompute term added per rank."""
    extra = recompute_s(plan, cost, recompute)
    return max(c.total_s + e for c, e in zip(plan.cost, extra))


def recompute_lower_bound_s(lengths, cost: CostModel, recompute) -> float:
    """The least recompute any plan of the batch can add to the busiest rank: the recomputed
    compute with every document whole (its fastest form), spread evenly, no communication; added to
    the plan's lower bound so that the bound stays one for plans that recompute."""
    from ..dp.memory import Recompute
    rc = Recompute.parse(recompute)
    if rc.granularity == "none" or not (rc.has("core_attn") or rc.has("mlp")):
        return 0.0
    m, world = cost.model, cost.topology.world_size
    tokens = sum(int(x) for x in lengths)
    t = 0.0
    if rc.has("core_attn"):
        t += sum(cost.doc_attention_s(int(L)) for L in lengths) / (1.0 + BWD_FLOPS)
    if rc.has("mlp"):
        head = LINEAR_PASSES * tokens * m.head_flops_per_token(cost.tp) / (cost.profile.gemm_tflops * 1e12)
        t += (cost.mlp_s(tokens) - head) / LINEAR_PASSES
    if rc.granularity == "full":
        t += cost.proj_s(tokens) / LINEAR_PASSES
    return t / world
