"""The report's summary beside the previous report's (issues 49 and 53: the closing note quotes the
summary before and after and names every number that moved by more than 5%).

The previous report is its figures folder's ``results.json`` (``zeppelin report`` writes every
summary and the per-cluster numbers there), read before the new one overwrites it. Compared: Zeppelin's deployed speedup over each
baseline (mean, max, configurations, losses) in the summary of all studies, Zeppelin / lower bound,
and per study each baseline's deployed mean speedup; a number that moved by more than ``MOVED`` is
flagged and listed, so the page names what a reader must see explained.

>>> old = {"summary": {"static_cp": {"deployed": {"mean_speedup": 1.30, "max_speedup": 3.27, "configs": 156,
...                                               "losses": []}}, "zeppelin_lower_bound": {"mean": 1.125, "max": 1.567}},
...        "studies": {"main": {"summary": {"static_cp": {"deployed": {"mean_speedup": 1.2}}}}}}
>>> new = {"summary": {"static_cp": {"deployed": {"mean_speedup": 1.10, "max_speedup": 3.27, "configs": 40,
...                                               "losses": ["k"]}}, "zeppelin_lower_bound": {"mean": 1.13, "max": 1.2}},
...        "studies": {"main": {"summary": {"static_cp": {"deployed": {"mean_speedup": 1.21}}}}}}
>>> rows = compare(digest(old), digest(new))
>>> [(r["name"], r["moved"]) for r in rows if r["moved"]]
[('static_cp: deployed mean speedup', True), ('static_cp: configurations', True), ('static_cp: Zeppelin slower in', True), ('Zeppelin / lower bound: max', True)]
>>> [r["name"] for r in rows if r["study"]]
['main: static_cp deployed mean speedup']
>>> run = lambda c, v, t: {"study": "memory", "cluster": c, "key": c, "variant": v, "iteration_s": t, "error": "",
...                        "lower_bound_s": 1.0, "oracle_iteration_s": t}
>>> both = [run("a800", "zeppelin", 1.0), run("a800", "static_cp", 1.5)]
>>> gone = dropped(digest({"runs": both + [run("h200", "zeppelin", 1.0), run("h200", "static_cp", 2.0)]}),
...                digest({"runs": both}))
>>> [(g["cluster"], g["configs"], g["static_cp"], g["best deployed baseline"]) for g in gone]
[('h200', 1, 2.0, 2.0)]
"""

from __future__ import annotations

import json
from typing import Dict, List, Optional

MOVED = 0.05  # a relative change above this is flagged: the closing note must explain it


def load(path: str) -> Optional[Dict]:
    """The digest of a previous report's results.json, or None where there is none (a first report)."""
    try:
        with open(path) as f:
            return digest(json.load(f))
    except (OSError, ValueError):
        return None


def digest(doc: Dict) -> Dict:
    """The numbers compared, as ``{name: value}`` for the summary and ``{study: {name: value}}``."""
    from megatron_zeppelin.sim.matrix import BEST, baselines
    s = doc.get("summary", {})
    top: Dict[str, float] = {}
    for b, x in sorted(baselines(s).items()):
        d = x.get("deployed") or {}
        name = "best deployed baseline" if b == BEST else b
        if d.get("mean_speedup") is not None:
            top[f"{name}: deployed mean speedup"] = d["mean_speedup"]
            top[f"{name}: deployed max speedup"] = d.get("max_speedup")
        if "configs" in d:
            top[f"{name}: configurations"] = d["configs"]
            top[f"{name}: Zeppelin slower in"] = len(d.get("losses", []))
    lb = s.get("zeppelin_lower_bound") or {}
    for k in ("mean", "max"):
        if lb.get(k) is not None:
            top[f"Zeppelin / lower bound: {k}"] = lb[k]
    studies = {}
    for study, st in sorted(doc.get("studies", {}).items()):
        studies[study] = {f"{b} deployed mean speedup": (x.get("deployed") or {}).get("mean_speedup")
                          for b, x in sorted(baselines(st.get("summary", {})).items())
                          if (x.get("deployed") or {}).get("mean_speedup") is not None}
    clusters = doc["clusters"] if "clusters" in doc else by_cluster(doc.get("runs", []))  # older files: runs
    return {"summary": top, "studies": studies, "clusters": clusters}


def by_cluster(runs) -> Dict[str, Dict[str, Dict]]:
    """{study: {cluster: {configs, baseline: deployed mean speedup, ...}}}: what a cut of clusters takes
    away, from the report that still ran them (runs with a wrong profile or a term off left out)."""
    from megatron_zeppelin.sim.matrix import BEST, baselines, summarize
    groups: Dict[tuple, list] = {}
    for r in runs:
        if not r.get("profile_error") and r.get("gpu_term_off", "nothing") == "nothing":
            groups.setdefault((r["study"], r.get("cluster")), []).append(r)
    out: Dict[str, Dict[str, Dict]] = {}
    for (study, cluster), rs in sorted(groups.items()):
        s = summarize(rs)["summary"]
        row = {"configs": len({r["key"] for r in rs})}
        for b, x in sorted(baselines(s).items()):
            m = (x.get("deployed") or {}).get("mean_speedup")
            if m is not None:
                row["best deployed baseline" if b == BEST else b] = m
        out.setdefault(study, {})[cluster] = row
    return out


def dropped(old: Dict, new: Dict) -> List[Dict]:
    """The (study, cluster) pairs the previous report ran and this one does not, in a study both ran:
    a cut of configurations, with the previous report's numbers for them."""
    out = []
    for study in sorted(set(old.get("clusters", {})) & set(new.get("clusters", {}))):
        for cluster, row in old["clusters"][study].items():
            if cluster not in new["clusters"][study]:
                out.append({"study": study, "cluster": cluster, **row})
    return out


def _moved(old, new) -> bool:
    if old is None or new is None:
        return old != new
    return abs(new - old) > MOVED * abs(old) if old else new != 0


def compare(old: Dict, new: Dict) -> List[Dict]:
    """Rows ``{name, study, previous, new, moved}``: every summary number of either report, then the
    per-study numbers both reports hold."""
    rows = [{"name": k, "study": "", "previous": old["summary"].get(k), "new": new["summary"].get(k)}
            for k in list(old["summary"]) + [k for k in new["summary"] if k not in old["summary"]]]
    for study in sorted(set(old["studies"]) & set(new["studies"])):
        o, n = old["studies"][study], new["studies"][study]
        rows += [{"name": f"{study}: {k}", "study": study, "previous": o[k], "new": n[k]} for k in o if k in n]
    for r in rows:
        r["moved"] = _moved(r["previous"], r["new"])
    return rows


def _v(x) -> str:
    return "-" if x is None else str(x) if isinstance(x, int) else f"{x:.3f}"


def render(old: Optional[Dict], new: Dict, source: str) -> List[str]:
    """The section's Markdown lines (none without a previous report)."""
    if not old:
        return []
    rows = compare(old, new)
    top = [r for r in rows if not r["study"]]
    moved = [r for r in rows if r["study"] and r["moved"]]
    L = ["## This report against the previous one", "",
         f"The summary of all studies (the section below of that name) beside the previous report's (`{source}`, "
         f"read before this report replaced it); a change of more than {100 * MOVED:.0f}% is marked, and the "
         "closing note must explain it (new baselines or settings, a cut in batches or configurations, a new "
         "cost term):", "",
         "| number | previous | new | moved > 5% |", "|---|---|---|---|"]
    L += [f"| {r['name']} | {_v(r['previous'])} | {_v(r['new'])} | {'yes' if r['moved'] else ''} |" for r in top]
    kept = sum(1 for r in rows if r["study"])
    L += ["", f"Per study, each baseline's deployed mean speedup in both reports: {kept} numbers, "
              f"{len(moved)} moved by more than {100 * MOVED:.0f}%" + (":" if moved else ".")]
    if moved:
        L += [""] + [f"- {r['name']}: {_v(r['previous'])} -> {_v(r['new'])}" for r in moved]
    gone = dropped(old, new)
    if gone:
        names = sorted({k for g in gone for k in g if k not in ("study", "cluster", "configs")})
        L += ["", "Clusters a study no longer runs (a cut: see *What this report cut*), with the previous "
                  "report's numbers for them, Zeppelin's deployed mean speedup over each baseline:", "",
              "| study | cluster | configs | " + " | ".join(names) + " |", "|" + "---|" * (3 + len(names))]
        L += [f"| {g['study']} | {g['cluster']} | {g['configs']} | " + " | ".join(
            f"{g[k]:.2f}x" if k in g else "-" for k in names) + " |" for g in gone]
    return L + [""]
