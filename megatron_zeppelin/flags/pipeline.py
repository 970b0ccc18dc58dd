"""``--pipeline-stages N`` of ``zeppelin plan`` / ``simulate``: Megatron's pipeline parallelism in the
iteration they show, as the benchmark matrix's ``pipeline`` runs it (sim/matrix.py): the stages split
``--nodes`` evenly, every micro-batch is planned on one stage's DP ranks (the domain), and the
iteration runs the micro-batches in Megatron's 1F1B over the stages (planner/iteration.py
``one_f_one_b``, read by the planner's Iteration and the simulator's ``pipeline`` alike), its bubble
included.

>>> from types import SimpleNamespace as NS
>>> from megatron_zeppelin.spec.hardware import load_profile
>>> from megatron_zeppelin.spec.model import load_model
>>> d, p = pipeline_domain(NS(nodes=4, tp=1, pipeline_stages=2), load_profile("h200"), load_model("llama-7b"))
>>> p, d.topology.nodes, d.topology.world_size
(2, 2, 16)
>>> print(pipeline_line(2, 4, 16, iteration_s=5.0, stage_work_s=4.0, allreduce_s=0.5))
pipeline: 2 stages of 16 DP ranks each, 1F1B over 4 micro-batches: iteration 5 s = the busiest stage's work 4 s + bubble 0.5 s (10.0%) + its 1/2 of the DP all-reduce 0.5 s
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Tuple

from megatron_zeppelin.flags.domain import Domain, FlagError, build_domain, require_at_least


def add_pipeline_flag(p) -> None:
    p.add_argument("--pipeline-stages", "--pipeline-model-parallel-size", type=int, default=1,
                   help="pipeline stages splitting --nodes evenly (Megatron's --pipeline-model-parallel-size): "
                        "each micro-batch is planned on one stage's DP ranks and the iteration runs the "
                        "micro-batches in 1F1B, its bubble shown (default 1: no pipeline)")


def pipeline_domain(args, profile, model) -> Tuple[Domain, int]:
    """(the Domain one micro-batch is planned on: one stage's nodes, the stages)."""
    require_at_least(args, (("pipeline_stages", "--pipeline-stages", 1),))
    stages = int(getattr(args, "pipeline_stages", 1) or 1)
    whole = build_domain(args, profile, model)  # every flag checked on the whole job first
    if stages == 1:
        return whole, 1
    nodes = whole.topology.nodes
    if nodes % stages:
        raise FlagError(f"--pipeline-stages {stages} does not divide the job's {nodes} node(s): the stages split "
                        "the nodes evenly (set --nodes to a multiple of --pipeline-stages)")
    one = SimpleNamespace(**{**vars(args), "nodes": nodes // stages, "world_size": None})
    return build_domain(one, profile, model), stages


def pipeline_line(stages: int, micro_batches: int, ranks: int, iteration_s: float, stage_work_s: float,
                  allreduce_s: float) -> str:
    """The iteration in 1F1B: the busiest stage's own work, the bubble it waits (the rest), the
    reduce of its share of the gradients."""
    bubble = iteration_s - stage_work_s - allreduce_s
    return (f"pipeline: {stages} stages of {ranks} DP ranks each, 1F1B over {micro_batches} micro-batch"
            f"{'es' if micro_batches > 1 else ''}: iteration {iteration_s:.4g} s = the busiest stage's work "
            f"{stage_work_s:.4g} s + bubble {bubble:.4g} s ({100 * bubble / iteration_s:.1f}%) + its 1/{stages} of "
            f"the DP all-reduce {allreduce_s:.4g} s")
