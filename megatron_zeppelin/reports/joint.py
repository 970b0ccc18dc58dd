"""Zeppelin's variants of other accumulations than its default: each micro-batch planned in data order
(``zeppelin+data_order``), a global batch's documents assigned to its micro-batches jointly
(``zeppelin+joint``) or by length (``zeppelin+by_length``; planner/accumulation.py), against the
default, packed as dynamic CP's rounds (``zeppelin``: spec/config.py DEFAULT_ACCUMULATION), on the
same runs.

>>> def rec(key, v, t):
...     return {"key": key, "study": "accumulation", "variant": v, "iteration_s": t, "error": ""}
>>> runs = [rec("a", "zeppelin", 2.0), rec("a", "zeppelin+joint", 1.6), rec("b", "zeppelin", 1.0),
...         rec("b", "zeppelin+joint", 1.0), rec("c", "zeppelin", 1.0)]
>>> s = joint_speedups(runs, "accumulation")
>>> s["mean_speedup"], s["min_speedup"], s["max_speedup"], s["configs"], s["faster"]
(1.125, 1.0, 1.25, 2, 1)
>>> joint_line(runs, "accumulation")[1][-92:]
'ean 1.125x, min 1.000x, max 1.250x, geomean 1.118x over 2 configurations; joint faster in 1.'
>>> joint_line(runs + [rec("a", "zeppelin+by_length", 2.5)], "accumulation")[3][-54:]
'n 0.800x over 1 configurations; by_length faster in 0.'
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence


def joint_speedups(runs: Sequence[Dict], study: str, variant: str = "zeppelin+joint") -> Optional[Dict]:
    """Over ``study``'s configurations that completed both: the default's (``zeppelin``) mean
    iteration over ``variant``'s (another accumulation: sim/runs.py ASSIGNED) (mean, geomean, min, max, configs;
    ``faster``: where it is faster, as the summary counts losses)."""
    from megatron_zeppelin.sim.matrix import _stats
    ok = {(r["key"], r["variant"]): r for r in runs
          if r["study"] == study and not r.get("error") and r.get("iteration_s")}
    pairs = [(k, z["iteration_s"] / ok[(k, variant)]["iteration_s"])
             for (k, v), z in sorted(ok.items()) if v == "zeppelin" and (k, variant) in ok]
    if not pairs:
        return None
    s = _stats(pairs)
    s["faster"] = sum(x > 1.0 for _, x in pairs)
    return s


def joint_line(runs: Sequence[Dict], study: str) -> List[str]:
    """The study section's lines on the other accumulations (none where the study did not run one
    beside the default)."""
    from megatron_zeppelin.reports.headline import ASSIGNED_ROWS
    from megatron_zeppelin.sim.runs import ASSIGNED
    from megatron_zeppelin.spec.config import DEFAULT_ACCUMULATION
    d = DEFAULT_ACCUMULATION.value
    L: List[str] = []
    for v, how in ASSIGNED.items():
        s = joint_speedups(runs, study, v)
        if not s:
            continue
        name = ASSIGNED_ROWS[how.value]
        L += ["", f"`{v}` vs `zeppelin` ({name}): speedup over the default, {d} ({d}'s mean "
                  f"iteration / {how.value}'s) mean {s['mean_speedup']:.3f}x, min {s['min_speedup']:.3f}x, max "
                  f"{s['max_speedup']:.3f}x, geomean {s['geomean_speedup']:.3f}x over {s['configs']} "
                  f"configurations; {how.value} faster in {s['faster']}."]
    return L
