"""What the report cut to run in its time budget, and what each cut costs (issues 49, 52, 53).

A cut is a study parameter of presets/runs/paper.yaml (fewer ``batches``, fewer ``clusters``), applied
to every strategy alike; the study's ``cut`` text says what it was before. Its cost is measured, not
assumed:

- fewer batches: the studies ``batches_16`` and ``batches_4`` run the same configurations with 16 and
  4 batches (batch b is sampled with seed + b: the 4 are the 16's first four; each run fixes its
  baselines' settings on its own batches). Per configuration, Zeppelin's speedup over the best
  deployed baseline both ways, and the standard error of the mean of the per-batch speedups
  (that baseline's batch time / Zeppelin's; sample standard deviation / sqrt(batches)); and the same
  standard error for every study at its own batches;
- fewer clusters: the previous report's numbers for the clusters gone (reports/previous.py).

>>> def rec(study, key, v, ts):
...     return {"study": study, "key": f"{study}/{key}", "label": key, "variant": v, "error": "",
...             "iteration_s": sum(ts) / len(ts), "batch_iteration_s": ts}
>>> runs = [rec("batches_16", "a", "zeppelin", [1.0] * 16), rec("batches_16", "a", "static_cp", [1.2, 1.4] * 8),
...         rec("batches_4", "a", "zeppelin", [1.0] * 4), rec("batches_4", "a", "static_cp", [1.2, 1.4] * 2)]
>>> c = check(runs)
>>> [(r["label"], round(r["long"], 3), round(r["short"], 3), round(r["se_long"], 4), round(r["se_short"], 4)) for r in c]
[('a', 1.3, 1.3, 0.0258, 0.0577)]
>>> round(standard_errors(runs)["batches_4"]["se"], 4), standard_errors(runs)["batches_4"]["batches"]
(0.0577, [4])
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Dict, List, Optional, Sequence

LONG, SHORT = "batches_16", "batches_4"  # the both-ways check's studies


def _best(vs: Dict[str, Dict]) -> Optional[tuple]:
    """(speedup over the best deployed baseline, standard error of the per-batch mean, batches) of one
    configuration's records, or None where Zeppelin or every baseline failed."""
    from megatron_zeppelin.sim.runs import ABLATIONS
    z = vs.get("zeppelin")
    if not z or z.get("error") or not z.get("iteration_s"):
        return None
    base = [r for v, r in vs.items() if v != "zeppelin" and v not in ABLATIONS and not r.get("error")
            and r.get("iteration_s")]
    if not base:
        return None
    b = min(base, key=lambda r: r["iteration_s"])
    per = [x / y for x, y in zip(b.get("batch_iteration_s") or [], z.get("batch_iteration_s") or []) if x and y]
    se = (math.sqrt(sum((x - sum(per) / len(per)) ** 2 for x in per) / (len(per) - 1)) / math.sqrt(len(per))
          if len(per) > 1 else None)
    return b["iteration_s"] / z["iteration_s"], se, len(per)


def _by_config(runs: Sequence[Dict], study: str) -> Dict[str, Dict[str, Dict]]:
    by: Dict[str, Dict[str, Dict]] = defaultdict(dict)
    for r in runs:
        if r["study"] == study:
            by[r["key"].split("/", 1)[1]][r["variant"]] = r
    return by


def check(runs: Sequence[Dict]) -> List[Dict]:
    """Per configuration both check studies completed: ``long`` / ``short`` speedups over the best
    deployed baseline at 16 / 4 batches, and their standard errors ``se_long`` / ``se_short``."""
    long, short = _by_config(runs, LONG), _by_config(runs, SHORT)
    out = []
    for key in sorted(set(long) & set(short)):
        a, b = _best(long[key]), _best(short[key])
        if a and b:
            out.append({"label": long[key]["zeppelin"].get("label") or key, "long": a[0], "short": b[0],
                        "se_long": a[1], "se_short": b[1]})
    return out


def standard_errors(runs: Sequence[Dict]) -> Dict[str, Dict]:
    """Per study: its batches per run and the mean over its configurations of the standard error of
    the per-batch speedup over the best deployed baseline (runs with a wrong profile or a term off are
    configurations of their own, as in their studies)."""
    by: Dict[str, Dict[str, Dict[str, Dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in runs:
        by[r["study"]][r["key"]][r["variant"]] = r
    out = {}
    for study, configs in sorted(by.items()):
        got = [x for x in (_best(vs) for vs in configs.values()) if x and x[1] is not None]
        if got:
            out[study] = {"se": sum(x[1] for x in got) / len(got), "configs": len(got),
                          "batches": sorted({x[2] for x in got})}
    return out


def _mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def render(runs: Sequence[Dict], cuts: Dict[str, str]) -> str:
    """The section's text: each study's cut (``cuts``: study -> the matrix's ``cut`` text), the both-ways
    check and every study's standard error."""
    L = ["### What this report cut", ""]
    if cuts:
        L += ["To run `--studies all` in about an hour on a 2-core machine, some studies run fewer batches or "
              "clusters than before (presets/runs/paper.yaml; every strategy alike, no baseline setting "
              "changed):", ""] + [f"- `{s}`: {t}" for s, t in cuts.items()]
    else:
        L += ["None of this report's studies is cut."]
    c = check(runs)
    if c:
        d = [abs(r["short"] - r["long"]) for r in c]
        L += ["", f"What 4 batches instead of 16 cost, measured on the studies `{LONG}` and `{SHORT}` (the same "
                  f"{len(c)} configurations both ways): Zeppelin's speedup over the best deployed baseline, and the "
                  "standard error of the mean per-batch speedup (sample standard deviation / sqrt(batches)):", "",
              "| configuration | 16 batches | 4 batches | difference | standard error, 16 | standard error, 4 |",
              "|---|---|---|---|---|---|"]
        L += [f"| {r['label']} | {r['long']:.3f}x | {r['short']:.3f}x | {r['short'] - r['long']:+.3f} | "
              f"{r['se_long']:.3f} | {r['se_short']:.3f} |" for r in c]
        L += ["", f"Mean speedup over these configurations: {_mean([r['long'] for r in c]):.3f}x with 16 batches, "
                  f"{_mean([r['short'] for r in c]):.3f}x with 4; the 4-batch figure is off by {_mean(d):.3f} on "
                  f"average (at most {max(d):.3f}); mean standard error {_mean([r['se_long'] for r in c]):.3f} with "
                  f"16 batches, {_mean([r['se_short'] for r in c]):.3f} with 4."]
    se = standard_errors(runs)
    if se:
        L += ["", "Every study's standard error of the mean per-batch speedup over the best deployed baseline, at "
                  "its own batches (mean over its configurations; with n batches it shrinks as 1/sqrt(n)):", "",
              "| study | batches | configs | standard error |", "|---|---|---|---|"]
        L += [f"| {s} | {'/'.join(map(str, x['batches']))} | {x['configs']} | {x['se']:.3f} |" for s, x in se.items()]
    return "\n".join(L)
