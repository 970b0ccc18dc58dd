"""Padding as the real CP systems charge it: what a padded document costs, written once.

Transformer Engine's THD context parallelism (p2p, a2a, a2a+p2p and all-gather alike) cuts every
document into 2 x cp equal chunks, so each must be a multiple of 2 x cp tokens; the pad rows sit at
its end (``cu_seqlens_padded``) and are computed and exchanged like real ones. Sources read
(NVIDIA/TransformerEngine d0067d0, NVIDIA/Megatron-LM d98e8a6, neither copied):

- TE transformer_engine/common/fused_attn/context_parallel.cu:100 ("we assume that each sequence
  length is divisible by (world_size*2)"), pytorch/csrc/extensions/attention.cpp:986
  (``total_tokens % (cp_size * 2) == 0``), pytorch/attention/dot_product_attention/
  context_parallel.py:598-599 (p2p THD: ``cu_seqlens // (cp_size * 2)``), :499 (a2a: dual-chunk
  reorder by ``cu_seqlens_padded``), :3785 (all-gather: "padded cu_seqlens (divisible by 2*cp_size)");
- Megatron-LM megatron/core/utils.py:2454-2463 (``_get_batch_on_this_cp_rank_per_document_balancing``:
  "Each document length must be divisible by 2 * cp_size"), megatron/training/datasets/
  sft_dataset.py:127-132 (each sequence padded to a multiple of ``context_parallel_size * 2``),
  megatron/core/models/multimodal/context_parallel.py:55-58 (``tp_size * cp_size * 2`` with
  sequence parallelism);
- Megatron's dynamic CP (megatron/core/datasets/gpt_dataset.py:62-67, ``hybrid_context_parallel``:
  every sample divisible by DP x CP x 2, times the SP size with sequence parallelism) schedules the
  padded lengths (data_schedule_utils.py:571-607: the scheduler's input is ``padded_seq_len``).

A strategy records the padded length on each DocPlan (``DocPlan.padded``). The Plan keeps the real
rows (layouts, schedule): the engine runs those and never the pad rows. Prediction (assemble.prepare)
and the simulator (sim/iteration.simulate) both read ``charged_plan``'s view, the same function: the
padded documents in equal chunks, their layouts and their ring messages, so pad rows are computed,
exchanged and held (spec/memory.plan_memory_balance counts them too) as the real systems do.

>>> pad_to(13, 8), pad_to(16, 8), pad_to(5, 1)
(16, 16, 5)
>>> from megatron_zeppelin.planner.testing import toy_context
>>> from megatron_zeppelin.planner.baselines.static_cp import cp_placement
>>> p = cp_placement([13, 6], toy_context(gpus=4), cp=2, comm="p2p")   # 2 x cp = 4
>>> [(d.length, d.padded) for d in p.docs], [d.charged().bounds for d in p.docs]
([(13, 16), (6, 8)], [(0, 4, 8, 12, 16), (0, 2, 4, 6, 8)])
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence, Tuple

from megatron_zeppelin.planner.build.layout import attention_layout
from megatron_zeppelin.planner.build.routing import route_schedule
from megatron_zeppelin.planner.build.schedule import ring_ops
from megatron_zeppelin.planner.types import DocPlan, Plan, ring_documents
from megatron_zeppelin.spec.words import Stage


def pad_to(length: int, multiple: int) -> int:
    """``length`` rounded up to a multiple of ``multiple``."""
    return -(-int(length) // multiple) * multiple


def cp_pad_multiple(cp: int, tp: int = 1, sp: bool = False) -> int:
    """The multiple TE's THD CP pads a document of a CP group of ``cp`` to: 2 x cp, times TP with
    sequence parallelism (Megatron's multimodal context_parallel.py:55-58); 1 (none) at cp 1.

    >>> cp_pad_multiple(1), cp_pad_multiple(4), cp_pad_multiple(4, tp=2, sp=True)
    (1, 8, 16)
    """
    if cp <= 1:
        return 1
    return 2 * cp * (tp if sp and tp > 1 else 1)


def held_capacity(ctx, held: Sequence[int]) -> int:
    """The capacity a padded strategy checks its held tokens (pad rows included) against: a set
    capacity (--zeppelin-capacity-tokens, or the memory-balance cap) is memory and binds them as it
    is; the default, 2 x the batch's mean tokens (plan_batch), is 2 x the mean tokens *held*.

    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> from megatron_zeppelin.spec.config import ZeppelinConfig
    >>> set_ = toy_context(gpus=2, capacity=7, config=ZeppelinConfig(gpus_per_node=2, capacity_tokens=7))
    >>> held_capacity(set_, [16]), held_capacity(toy_context(gpus=2, capacity=7), [16])
    (7, 16)
    """
    if ctx.config.capacity_tokens or ctx.memory_first:
        return ctx.capacity
    return max(ctx.capacity, 2 * -(-sum(held) // ctx.topology.world_size))


def charged_docs(docs: Sequence[DocPlan]) -> Tuple[DocPlan, ...]:
    """Every document as charged (``DocPlan.charged``)."""
    return tuple(d.charged() for d in docs)


def is_padded(plan: Plan) -> bool:
    return any(d.padded for d in plan.docs)


def charged_plan(plan: Plan, cost, config=None) -> Plan:
    """The plan as its padded documents cost: charged documents, their attention layout (also the
    linear one: padded strategies do not remap), and their ring messages (routed as the plan's
    were). ``plan`` itself when nothing is padded."""
    if not is_padded(plan):
        return plan
    docs = charged_docs(plan.docs)
    att = attention_layout(docs, plan.rings, plan.topology.world_size)
    ops = charged_ops(plan.rings, docs, cost, config, routed=any(o.stage != Stage.DIRECT for o in plan.schedule))
    return replace(plan, docs=docs, attention_layout=att, linear_layout=att if not plan.remap else plan.linear_layout,
                   schedule=tuple(ops))


def charged_ops(rings, docs: Sequence[DocPlan], cost, config, routed: bool) -> list:
    """The ring messages of charged ``docs`` (the pad rows travel with their chunks)."""
    ops = ring_ops(rings, ring_documents(docs, rings), cost.topology, cost.kv_bytes_per_token, cost.link_of,
                   cost.model.q_bytes_per_token(cost.tp))
    return route_schedule(ops, cost.topology, cost, config) if routed else ops
