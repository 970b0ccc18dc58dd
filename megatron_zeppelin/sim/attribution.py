"""Which kind of candidate won a Zeppelin plan: the paper's partitioner or a shape of the portfolio.

Zeppelin's search (planner/partitioner/partition.py) assembles the partitioner's variants
(``rate/inter/rings/remap``, e.g. ``all/hide/free/time``) and then the baselines' fixed shapes
(planner/portfolio/shapes.py: ``cp4/off``, ``cp8+routing/time``, ``a2a2/off``, ``a2a+p2p2x4/off``, ``hybrid_dp/time``,
``dynamic_cp/4096/off``), and keeps the least predicted; the winner's label is the plan's
``meta["variant"]``. The matrix counts the kinds per run so a report can say how much of a
speedup is the paper's partitioner and how much is a baseline's own shape run by Zeppelin's engine.

>>> [candidate_kind(v) for v in ("all/hide/free/time", "all/forced/aligned/off", "cp1/off", "cp4+routing/time",
...                              "a2a2/off", "a2a+p2p2x4/off", "hybrid_dp+routing/time", "dynamic_cp/4096/off", "")]
['partitioner', 'partitioner, aligned rings', 'packed (cp1)', 'static_cp p2p', 'static_cp a2a', 'static_cp a2a+p2p', 'hybrid_dp', 'dynamic_cp', '']
>>> count_kinds(["all/hide/free/time", "cp2/off", "all/hide/free/off", ""])
{'partitioner': 2, 'static_cp p2p': 1}
"""

from __future__ import annotations

import re
from typing import Dict, Iterable

PARTITIONER = "partitioner"  # the paper's greedy, free rings (its variants differ by budget rate, inter rule, remap)
KINDS = (PARTITIONER, "partitioner, aligned rings", "packed (cp1)", "static_cp p2p", "static_cp a2a",
         "static_cp a2a+p2p", "hybrid_dp", "dynamic_cp")  # a report's column order


def candidate_kind(label: str) -> str:
    """The kind of a winning candidate's label (``plan.meta["variant"]``); "" for a plan without one
    (a baseline's own plan)."""
    if not label:
        return ""
    head = label.split("/")[0].replace("+routing", "")  # routed or not: the same shape
    if head in ("all", "proj"):  # the partitioner's variants: rate/inter/rings/remap
        return "partitioner, aligned rings" if "/aligned/" in label else PARTITIONER
    if head == "cp1":
        return "packed (cp1)"
    if re.fullmatch(r"cp\d+", head):
        return "static_cp p2p"
    if re.fullmatch(r"a2a\d+", head):
        return "static_cp a2a"
    if re.fullmatch(r"a2a\+p2p\d+x\d+", head):  # TE's hierarchical a2a+p2p, a2a group x ring of groups
        return "static_cp a2a+p2p"
    if head in ("hybrid_dp", "dynamic_cp"):
        return head
    return "other: " + head  # a shape this module does not know yet: shown, never dropped


def count_kinds(labels: Iterable[str]) -> Dict[str, int]:
    """{kind: how many of ``labels`` it won}, kinds in KINDS order (unlabelled plans left out)."""
    out: Dict[str, int] = {}
    for lb in labels:
        k = candidate_kind(lb)
        if k:
            out[k] = out.get(k, 0) + 1
    order = {k: i for i, k in enumerate(KINDS)}
    return dict(sorted(out.items(), key=lambda kv: (order.get(kv[0], len(KINDS)), kv[0])))
