"""Ranks must execute the same plan: compare digests across the domain, fail clearly on mismatch.

A mismatch means the ranks planned different batches (different data order, lengths, flags or
code versions): every rank raises the same error naming the first differing field, no rank hangs.
"""

from __future__ import annotations

import torch.distributed as dist

from megatron_zeppelin.planner.types import Plan, PlanError


class PlanMismatchError(PlanError):
    pass


def check_plan_agreement(plan: Plan, group=None) -> None:
    """Collective over ``group``: all ranks return, or all raise PlanMismatchError."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    digests = [None] * dist.get_world_size(group)
    dist.all_gather_object(digests, plan.digest(), group=group)
    if len(set(digests)) == 1:
        return
    plans = [None] * len(digests)
    dist.all_gather_object(plans, plan.to_json(), group=group)
    first = Plan.from_json(plans[0])
    bad = next(i for i, d in enumerate(digests) if d != digests[0])
    where = first.first_difference(Plan.from_json(plans[bad]))
    raise PlanMismatchError(
        f"ranks disagree on the plan: group rank {bad} differs from group rank 0 at {where} "
        f"(digests {digests}); every rank must plan the same global micro-batch with the same "
        "--zeppelin-* flags, data order (--seed, --data-path) and code version")
