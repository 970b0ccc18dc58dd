"""Small contexts for docstring examples and tests (a toy profile and model)."""

from __future__ import annotations

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.model import ModelSpec
from megatron_zeppelin.spec.hardware import HardwareProfile
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.planner.context import PlanContext
from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.spec.words import DocClass

TOY_MODEL = ModelSpec(name="toy", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256)
TOY_PROFILE = HardwareProfile(
    name="toy", gpu="toy", gemm_tflops=100.0, attn_seqlen=(128, 4096), attn_fwd_tflops=(20.0, 100.0),
    attn_bwd_tflops=(16.0, 80.0), nvlink_GBps=100.0, nvlink_latency_us=3.0, nic_GBps=10.0,
    nic_latency_us=15.0, gpus_per_node=4, nics_per_node=2)


def toy_context(nodes: int = 1, gpus: int = 4, nics: int = 0, config: ZeppelinConfig = None,
                capacity: int = 1 << 40) -> PlanContext:
    topo = Topology(nodes, gpus, nics)
    cfg = config or ZeppelinConfig(gpus_per_node=gpus)
    return PlanContext(topo, TOY_MODEL, TOY_PROFILE, cfg, CostModel(TOY_MODEL, TOY_PROFILE, topo), capacity)


def rank_signature(plan):
    """Per rank: multiset of (class, ring ranks, length) of what it holds (order-free), to compare plans
    of the same batch given in different orders."""
    from collections import Counter
    out = []
    for r in range(plan.world_size):
        items = [(DocClass.LOCAL, (), d.length) for d in plan.local_docs(r)]
        for ring in plan.rings_of(r):
            items += [(ring.cls, ring.ranks, plan.docs[d].length) for d in ring.docs]
        out.append(Counter(items))
    return out
