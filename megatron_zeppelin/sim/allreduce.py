"""The data-parallel gradient all-reduce: the same for every strategy (it depends on the model and
the domain, not on the plan).

Its seconds are the planner's (cost_model.py ``dp_allreduce_s`` / ``ring_allreduce_s``, re-exported
here as ``allreduce_s``), so the plan reports the same term the simulator adds.

Megatron DDP either all-reduces after the whole backward (``--overlap-grad-reduce`` off, its
default) or per bucket as the backward finishes each layer (on): ``exposed_s`` models both with one
bucket per layer, buckets reduced one after the other.

>>> exposed_s(1.0, layer_ends=[1.0, 2.0, 3.0], backward_end=3.0, overlap=True)  # 3 buckets of 1/3 s
0.3333333333333335
"""

from __future__ import annotations

from typing import Sequence

from megatron_zeppelin.planner.cost.cost_model import ring_allreduce_s as allreduce_s  # noqa: F401 (advise/recommend.py uses it)


def exposed_s(total_s: float, layer_ends: Sequence[float], backward_end: float, overlap: bool) -> float:
    """Seconds the all-reduce adds after the backward. ``layer_ends``: when the backward finished
    each layer (in backward order); without overlap the whole all-reduce follows the backward."""
    if not overlap or not layer_ends:
        return total_s
    per = total_s / len(layer_ends)
    t = 0.0
    for e in layer_ends:
        t = max(t, e) + per
    return max(0.0, t - backward_end)
