"""A pipeline study's table (issue 52): per pipeline size, Zeppelin's speedup over every baseline and
over the best deployed baseline of each configuration, planned as the plugin does by default
(``zeppelin``: spec/config.py DEFAULT_ACCUMULATION) and with each other accumulation that ran
(``zeppelin+data_order``, ``+joint``, ``+by_length``), on the same runs (sim/iteration.py ``pipeline``: 1F1B stages, each
micro-batch planned on one stage's DP ranks).

>>> def rec(key, pp, v, t):
...     return {"key": key, "study": "pipeline", "pipeline": pp, "ranks": 16 // pp, "variant": v,
...             "iteration_s": t, "error": ""}
>>> runs = [rec("a", 1, "zeppelin", 1.0), rec("a", 1, "zeppelin+joint", 0.8), rec("a", 1, "packed_dp", 1.2),
...         rec("a", 1, "static_cp", 1.6), rec("b", 2, "zeppelin", 2.0), rec("b", 2, "packed_dp", 3.0)]
>>> t = pipeline_table(runs, "pipeline")
>>> t[2]
'| 1 | 16 | 1 | 1.20x / 1.50x | 1.60x / 2.00x | 1.20x / 1.50x (min 1.20x, max 1.20x) | 1.250x |'
>>> t[3]
'| 2 | 8 | 1 | 1.50x | - | 1.50x (min 1.50x, max 1.50x) | - |'
>>> pipeline_table(runs + [rec("a", 1, "zeppelin+by_length", 0.5)], "pipeline")[2]   # rounds / joint / by_length
'| 1 | 16 | 1 | 1.20x / 1.50x / 2.40x | 1.60x / 2.00x / 3.20x | 1.20x / 1.50x / 2.40x (min 1.20x, max 1.20x) | 1.250x | 2.000x |'
>>> iteration_table(runs, "pipeline")[2:]
['| 1 | 1.00 (1) | 0.80 (1) | 1.20 (1) | 1.60 (1) |', '| 2 | 2.00 (1) | - | 3.00 (1) | - |']
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional, Sequence


def is_pipeline_study(runs: Sequence[Dict], study: str) -> bool:
    """A study some of whose runs have pipeline stages."""
    return any(r["study"] == study and int(r.get("pipeline", 1) or 1) > 1 for r in runs)


def _mean(xs: List[float]) -> Optional[float]:
    return sum(xs) / len(xs) if xs else None


def _x(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _default() -> str:
    from megatron_zeppelin.spec.config import DEFAULT_ACCUMULATION
    return DEFAULT_ACCUMULATION.value


def _regrouped(runs: Sequence[Dict], study: str) -> List[str]:
    """The other accumulations' variants (sim/runs.py ASSIGNED) that ran in ``study``, in ASSIGNED's order."""
    from megatron_zeppelin.sim.runs import ASSIGNED
    ran = {r["variant"] for r in runs if r["study"] == study}
    return [v for v in ASSIGNED if v in ran]


def pipeline_table(runs: Sequence[Dict], study: str) -> List[str]:
    """Rows per pipeline size: its DP ranks per stage, configurations, then Zeppelin's mean speedup
    over each baseline and over the best deployed baseline per configuration, "rounds / joint /
    ..." (the default, then each other accumulation that ran), and each one's speedup over the default."""
    from megatron_zeppelin.sim.runs import ABLATIONS
    by: Dict[int, Dict[str, Dict[str, Dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in runs:
        if r["study"] == study and not r.get("error") and r.get("iteration_s"):
            by[int(r.get("pipeline", 1) or 1)][r["key"]][r["variant"]] = r
    bases = sorted({v for p in by.values() for vs in p.values() for v in vs
                    if v != "zeppelin" and v not in ABLATIONS})
    zs = ["zeppelin"] + _regrouped(runs, study)
    rows = []
    for pp in sorted(by):
        cells: Dict[str, Dict[str, List[float]]] = {b: {z: [] for z in zs} for b in bases + ["best"]}
        ranks = sorted({vs["zeppelin"].get("ranks") for vs in by[pp].values() if "zeppelin" in vs} - {None})
        over_default: Dict[str, List[float]] = {z: [] for z in zs[1:]}
        configs = 0
        for vs in by[pp].values():
            if "zeppelin" not in vs:
                continue
            configs += 1
            for z in zs[1:]:
                if z in vs:
                    over_default[z].append(vs["zeppelin"]["iteration_s"] / vs[z]["iteration_s"])
            best = min((vs[b]["iteration_s"] for b in bases if b in vs), default=None)
            for z in zs:
                if z not in vs:
                    continue
                for b in bases:
                    if b in vs:
                        cells[b][z].append(vs[b]["iteration_s"] / vs[z]["iteration_s"])
                if best is not None:
                    cells["best"][z].append(best / vs[z]["iteration_s"])

        def cell(b: str) -> str:
            means = [_mean(cells[b][z]) for z in zs]
            if all(m is None for m in means[1:]):
                return _x(means[0])
            return " / ".join(_x(m) for m in means)
        best = cells["best"]["zeppelin"]
        span = f" (min {_x(min(best))}, max {_x(max(best))})" if best else ""
        rows.append([str(pp), "/".join(str(x) for x in ranks) or "-", str(configs)] + [cell(b) for b in bases]
                    + [cell("best") + span] + [f"{_mean(over_default[z]):.3f}x" if over_default[z] else "-"
                                               for z in zs[1:]])
    head = (["PP", "DP ranks per stage", "configs"] + [f"over {b}" for b in bases]
            + ["over the best deployed baseline"] + [f"{z.split('+')[1]}: speedup over {_default()}" for z in zs[1:]])
    return (["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
            + ["| " + " | ".join(r) + " |" for r in rows])


def iteration_table(runs: Sequence[Dict], study: str) -> List[str]:
    """Rows per pipeline size: every variant's mean simulated iteration (s) over the configurations,
    Zeppelin by default and in its other accumulations first, so a baseline faster than Zeppelin at some size shows as is
    (its losses are also listed per configuration under the regime's summary)."""
    by: Dict[int, Dict[str, List[float]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        if r["study"] == study and not r.get("error") and r.get("iteration_s"):
            by[int(r.get("pipeline", 1) or 1)][r["variant"]].append(r["iteration_s"])
    zs = ["zeppelin"] + _regrouped(runs, study)
    variants = sorted({v for p in by.values() for v in p}, key=lambda v: (zs.index(v) if v in zs else len(zs), v))
    rows = [[str(pp)] + [(f"{_mean(by[pp][v]):.2f} ({len(by[pp][v])})" if by[pp][v] else "-") for v in variants]
            for pp in sorted(by)]
    head = ["PP"] + [f"{v} (s)" for v in variants]
    return (["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
            + ["| " + " | ".join(r) + " |" for r in rows])


def pipeline_section(runs: Sequence[Dict], study: str) -> List[str]:
    """The study section's pipeline part (none for a study without pipeline stages)."""
    if not is_pipeline_study(runs, study):
        return []
    zs = ["zeppelin"] + _regrouped(runs, study)
    names = " / ".join([_default()] + [z.split("+")[1] for z in zs[1:]])
    return ["", "By pipeline size (1F1B; a stage's time is its slowest DP rank's, the bubble included): Zeppelin's "
                "mean speedup over each baseline's iteration as deployed, and over the best deployed baseline of "
                f"each configuration, as `{names}` ({' / '.join(f'`{z}`' for z in zs)}):", ""] + \
        pipeline_table(runs, study) + \
        ["", f"Mean simulated iteration (s) by pipeline size, Zeppelin ({names}) and each baseline as deployed "
             "(configurations completed in parentheses; a mean over different configurations where a strategy "
             "ran out of memory in some):", ""] + iteration_table(runs, study)
