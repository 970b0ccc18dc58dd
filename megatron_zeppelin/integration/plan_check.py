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


def _digest_words(plan: Plan):
    """The 64-bit digest as two int64 words (a tensor any backend gathers)."""
    import torch
    v = int(plan.digest(), 16)
    return torch.tensor([v >> 32, v & 0xFFFFFFFF], dtype=torch.int64)


class StagePlanCheck:
    """Plan digests compared across the stages of one pipeline, without blocking its schedule.

    A stage cannot wait for another inside its forward step: under 1F1B stage 0 runs the forward of
    micro-batch k+1 before stage 1 has received micro-batch k, so a blocking collective there
    deadlocks. Each stage therefore starts an asynchronous all-gather of its digest on a gloo group
    of its own (never the group Megatron's p2p uses, so the two never interleave) and waits for
    those gathers when the next phase (iteration, or training <-> evaluation) starts, and at
    shutdown: by then every stage has run every forward of the phase before (its gradient and
    loss reductions span the stages), so the gathers complete. A mismatch raises on every stage.
    ``ranks``: the global ranks of this rank's pipeline; every rank of the job calls this together
    (the groups of all pipelines are made on every rank, in one order, as torch requires).
    """

    def __init__(self, ranks, timeout=None):
        self.ranks = sorted(ranks)
        pipelines = [None] * dist.get_world_size()
        dist.all_gather_object(pipelines, self.ranks)
        self.group, _ = dist.new_subgroups_by_enumeration(sorted(set(map(tuple, pipelines))), timeout=timeout,
                                                           backend="gloo")
        self._pending = []  # (work, gathered digests, what)
        self._phase = None

    def submit(self, plan: Plan, phase, what: str) -> None:
        """Start comparing ``plan`` (of micro-batch ``what``) across the stages; ``phase``: any
        value that changes when an iteration or an evaluation starts."""
        if phase != self._phase:
            self.wait()
            self._phase = phase
        mine = _digest_words(plan)
        out = [mine.clone() for _ in self.ranks]
        self._pending.append((dist.all_gather(out, mine, group=self.group, async_op=True), out, what))

    def wait(self) -> None:
        """Finish every comparison started; all stages raise PlanMismatchError on a mismatch."""
        pending, self._pending = self._pending, []
        for work, out, what in pending:
            work.wait()
            digests = [f"{(int(t[0]) << 32) | int(t[1]):016x}" for t in out]
            if len(set(digests)) > 1:
                bad = next(i for i, d in enumerate(digests) if d != digests[0])
                raise PlanMismatchError(
                    f"pipeline stages disagree on the plan of {what}: rank {self.ranks[bad]} differs from rank "
                    f"{self.ranks[0]} (digests {digests}); every stage must read the same documents in the same "
                    "order (--seed, --data-path) with the same --zeppelin-* flags and code version")
