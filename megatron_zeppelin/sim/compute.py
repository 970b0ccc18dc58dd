"""Seconds of the compute kernels and TP collectives of one layer on one rank: the planner's
CostModel, read per kernel the way the simulator's task graph needs it (nothing is priced here).

The linear modules are split where the layer runs them: the QKV and output projections on the
rank's attention-layout tokens, the MLP on its linear-layout tokens; backward = 2x forward FLOPs
(input and weight gradients). With tensor parallelism each layer has 2 all-reduces of the
activations over the TP group in the forward and 2 in the backward (Megatron without sequence
parallelism); they run on NVLink and block the compute stream.

Toy model (hidden 64, 4 heads of 16, 2 KV heads, FFN 128) at 100 TFLOP/s:

>>> from megatron_zeppelin.planner.testing import toy_context
>>> k = LayerCosts(toy_context().cost)
>>> k.proj_s(1000) * 1e9   # ns for 1000 tokens, forward: 1000 * 2*(64*64 + 2*64*32 + 64*64) / 1e14
245.76

``ring_step_s`` gives every member's compute of every ring step at once, each step one kernel call
(program.py ``ring_step_costs``); on a profile priced per block it equals the block-by-block sum of
the cost model's block function (full blocks at the profile's full-block table when it has one,
causal ones at the causal table); on one priced by sequence (the GPU presets) each block runs at
its sequence's rate (``call_blocks_s``):

>>> from megatron_zeppelin.planner.program import ring_step_blocks
>>> from megatron_zeppelin.planner.types import DocPlan, Ring
>>> ring, doc = Ring(0, (0, 1), "intra", (0,)), DocPlan(0, 6000, "intra", 0, -1, (0, 1500, 3000, 4500, 6000))
>>> fwd, bwd = k.ring_step_s(ring, {0: doc})
>>> ref = sum(k.block_fwd_s(*b) for b in ring_step_blocks(ring, {0: doc}, 1, 1))
>>> bool(abs(fwd[1, 1] - ref) < 1e-12 * ref)
True
"""

from __future__ import annotations

from megatron_zeppelin.planner.cost.cost_model import LINEAR_PASSES, CostModel
from megatron_zeppelin.planner.cost.moe_cost import moe_pass_s
from megatron_zeppelin.planner.program import ring_step_costs
from megatron_zeppelin.planner.types import Ring


class LayerCosts:
    def __init__(self, cost: CostModel):
        self.cost = cost

    # Forward seconds of one layer; the backward of a GEMM is twice its forward.
    def proj_s(self, tokens: int) -> float:
        return self.qkv_s(tokens) + self.out_s(tokens)

    def qkv_s(self, tokens: int) -> float:
        return float(self.cost.gemm_s(tokens, "qkv"))

    def out_s(self, tokens: int) -> float:
        return float(self.cost.gemm_s(tokens, "out"))

    def mlp_s(self, tokens: int) -> float:
        return float(self.cost.gemm_s(tokens, "mlp"))

    def mlp_pass_s(self, t_lin) -> tuple:
        """(forward, backward) seconds of one layer's MLP per rank for the linear-layout token
        counts of every rank: an MoE layer's depend on its whole EP group (planner/cost/moe_cost.py)."""
        return (moe_pass_s(self.cost, t_lin).tolist(), moe_pass_s(self.cost, t_lin, backward=True).tolist())

    def head_iteration_s(self, tokens: int) -> float:
        """Vocab head forward + backward (once per iteration, on the linear layout)."""
        return LINEAR_PASSES * float(self.cost.gemm_s(tokens, "head"))

    def tp_allreduce_s(self, tokens: int) -> float:
        """Megatron's TP communication of ``tokens`` hidden states after a block (NVLink): one ring
        all-reduce, or with sequence parallelism an all-gather and a reduce-scatter (cost_model.tp_comm_s)."""
        return float(self.cost.tp_comm_s(tokens))

    def sp_allgather_s(self, tokens: int) -> float:
        """With sequence parallelism, the remap's all-gather of its source layout over TP."""
        return float(self.cost.sp_allgather_s(self.cost.layout_rows(tokens))) if self.cost.sp else 0.0

    # Attention blocks: (q, kv, causal) of one layer.
    def block_fwd_s(self, q: int, kv: int, causal: bool) -> float:
        return self.cost.block_fwd_s(q, kv, causal)

    def block_bwd_s(self, q: int, kv: int, causal: bool) -> float:
        return self.cost.block_bwd_s(q, kv, causal)

    def ring_step_s(self, ring: Ring, docs) -> tuple:
        """(forward, backward) seconds of one layer, arrays [member, step]."""
        members = Ring(0, tuple(range(ring.size)), ring.cls, ring.docs, ring.comm)  # member index as rank
        fwd, bwd = ring_step_costs(self.cost, [members], docs, ring.size, ring.size)
        return fwd.T, bwd.T
