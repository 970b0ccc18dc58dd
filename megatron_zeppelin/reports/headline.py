"""The report's headline (issue 49): Zeppelin against the best deployed baseline of each configuration
in the regime users run, 1M-4M-token global batches with gradient accumulation.

Per configuration, the speedup is the fastest baseline's mean simulated iteration (as deployed: its
run-level settings fixed for the run) over Zeppelin's; Zeppelin's own variants (sim/runs.py
ABLATIONS: zeppelin+joint, the partitioner alone, ...) are never a baseline. It is summarised for MHA
models (kv_heads = heads), GQA models (kv_heads < heads) and both, per long-context mix, beside the
issue's aims, which are stated, never asserted: a measured number is reported whatever it is.

>>> def rec(key, v, t, model="llama-7b", ds="arxiv"):
...     return {"key": key, "label": key, "study": "accumulation", "variant": v, "iteration_s": t, "error": "",
...             "lower_bound_s": 0.8, "model": model, "dataset": ds, "context": 65536, "micro_batches": 4,
...             "global_batch_tokens": 1 << 20}
>>> recs = [rec("a", "zeppelin", 1.0), rec("a", "static_cp", 1.5), rec("a", "packed_dp", 2.0),
...         rec("a", "zeppelin+joint", 0.5),        # Zeppelin's own variant: not a baseline
...         rec("b", "zeppelin", 1.0, "llama3-8b"), rec("b", "hybrid_dp", 0.9, "llama3-8b")]
>>> h = headline(recs)
>>> h["groups"]["MHA"]["mean_speedup"], h["groups"]["GQA"]["mean_speedup"], h["groups"]["all"]["mean_speedup"]
(1.5, 0.9, 1.2)
>>> [(l["label"], l["baseline"]) for l in h["losses"]], h["best_of"]
([('b', 'hybrid_dp')], {'hybrid_dp': 1, 'static_cp': 1})
>>> h["lower_bound"]["mean"], h["joint"]["all"]["mean_speedup"]   # joint: over the same best baselines
(1.25, 3.0)
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Dict, List, Optional, Sequence

GLOBAL_BATCH_TOKENS = (1 << 20, 4 << 20)  # the global batches the issue asks the headline at
LONG_CONTEXT = ("prolong64k", "arxiv", "github")  # the long-context mixes, at LONG_CONTEXT_TOKENS
LONG_CONTEXT_TOKENS = 1 << 16
AIM_MEAN = 1.25  # issue 49's aim: mean speedup over the best deployed baseline on the long-context mixes
LOWER_BOUND_GOAL = (1.08, 1.25)  # issue 49's goal for Zeppelin / lower bound: mean, max
KINDS = ("MHA", "GQA")


def accumulated(r: Dict) -> bool:
    """A run whose iterations are global batches of several micro-batches (gradient accumulation)."""
    return int(r.get("micro_batches", 1) or 1) > 1


def pipelined(r: Dict) -> bool:
    """A run split into pipeline stages (1F1B): its own regime, shown in its study's section."""
    return int(r.get("pipeline", 1) or 1) > 1


def in_headline(r: Dict) -> bool:
    """A run of the headline's regime: several micro-batches per 1M-4M-token global batch, no pipeline
    stages, Zeppelin as it ships (not a study of its variants, of balance_memory, or of a wrong profile)."""
    lo, hi = GLOBAL_BATCH_TOKENS
    return (accumulated(r) and not pipelined(r) and lo <= int(r.get("global_batch_tokens") or 0) <= hi
            and not r.get("profile_error") and not r.get("balance_memory")
            and r.get("gpu_term_off", "nothing") == "nothing"
            and not str(r.get("study", "")).startswith("ablation"))


@functools.lru_cache(maxsize=None)
def attention_kind(model: str) -> str:
    """``MHA`` (every query head has its own K/V head) or ``GQA`` (fewer K/V heads); ``?`` for a model
    this checkout does not know (a results file from a user's own preset)."""
    from megatron_zeppelin.errors import ZeppelinError
    from megatron_zeppelin.spec.model import load_model
    try:
        m = load_model(model)
    except (ZeppelinError, OSError):
        return "?"
    return "MHA" if m.kv_heads == m.heads else "GQA"


def configurations(records: Sequence[Dict], reference: str = "zeppelin") -> List[Dict]:
    """One row per configuration ``reference`` completed: ``speedup`` over its fastest deployed
    baseline (None where no baseline completed), which baseline that was (``baseline``), ``kind``
    (MHA / GQA), ``lower_bound`` (``reference``'s iteration / the lower bound)."""
    from megatron_zeppelin.sim.runs import ABLATIONS
    by: Dict[str, Dict[str, Dict]] = defaultdict(dict)
    for r in records:
        by[r["key"]][r["variant"]] = r
    rows = []
    for key in sorted(by):
        vs = by[key]
        z = vs.get(reference)
        if not z or z.get("error") or not z.get("iteration_s"):
            continue
        base = sorted((r["iteration_s"], v) for v, r in vs.items()
                      if v != "zeppelin" and v != reference and v not in ABLATIONS
                      and not r.get("error") and r.get("iteration_s"))
        rows.append({"key": key, "label": z.get("label") or key, "dataset": z.get("dataset"),
                     "context": z.get("context"), "kind": attention_kind(str(z.get("model"))),
                     "speedup": base[0][0] / z["iteration_s"] if base else None,
                     "baseline": base[0][1] if base else None,
                     "lower_bound": z["iteration_s"] / z["lower_bound_s"] if z.get("lower_bound_s") else None})
    return rows


def _stats(rows: List[Dict]) -> Dict:
    from megatron_zeppelin.sim.matrix import _stats as speedup_stats  # the summary's own statistics
    return speedup_stats([(r["key"], r["speedup"]) for r in rows if r["speedup"] is not None])


def _groups(rows: List[Dict]) -> Dict[str, Dict]:
    out = {k: _stats([r for r in rows if r["kind"] == k]) for k in KINDS}
    out["all"] = _stats(rows)
    return out


def headline(records: Sequence[Dict], reference: str = "zeppelin") -> Dict:
    """The headline's numbers over the runs of ``records`` that are :func:`in_headline`: ``groups``
    (MHA, GQA, all: mean / geomean / min / max speedup over the best deployed baseline), ``datasets``
    (per long-context mix at 64K, and ``together``), ``lower_bound`` (mean, max), ``losses``,
    ``best_of``, ``no_baseline`` (labels of configurations no baseline completed), and per regrouped
    Zeppelin variant of another accumulation than the default (``data_order``, ``joint``, ``by_length``:
    sim/runs.py ASSIGNED) the same groups with it, where it ran."""
    from megatron_zeppelin.sim.runs import ASSIGNED
    mine = [r for r in records if in_headline(r)]
    rows = configurations(mine, reference)
    ranked = [r for r in rows if r["speedup"] is not None]
    long_ctx = [r for r in ranked if r["dataset"] in LONG_CONTEXT and r["context"] == LONG_CONTEXT_TOKENS]
    datasets = {ds: _groups([r for r in long_ctx if r["dataset"] == ds]) for ds in LONG_CONTEXT}
    datasets = {ds: g for ds, g in datasets.items() if g["all"]["configs"]}
    if datasets:
        datasets["together"] = _groups(long_ctx)
    lbs = [r["lower_bound"] for r in rows if r["lower_bound"]]
    best_of: Dict[str, int] = defaultdict(int)
    for r in ranked:
        best_of[r["baseline"]] += 1
    assigned = {}
    for v, how in ASSIGNED.items():
        vrows = configurations(mine, v) if any(r["variant"] == v for r in mine) else []
        assigned[how.value] = _groups(vrows) if vrows else None
    return {"configs": len(rows), "global_batches": sorted({int(r["global_batch_tokens"]) for r in mine}),
            "groups": _groups(ranked), "datasets": datasets,
            "lower_bound": {"mean": sum(lbs) / len(lbs), "max": max(lbs), "configs": len(lbs)} if lbs else None,
            "losses": sorted(({"label": r["label"], "speedup": r["speedup"], "baseline": r["baseline"]}
                              for r in ranked if r["speedup"] < 1.0), key=lambda l: l["speedup"]),
            "best_of": dict(sorted(best_of.items())),
            "no_baseline": [r["label"] for r in rows if r["speedup"] is None],
            **assigned}


# The headline's row of each accumulation's variant (sim/runs.py ASSIGNED), in this order; the
# default's (spec/config.py DEFAULT_ACCUMULATION) is ``zeppelin`` itself
ASSIGNED_ROWS = {"data_order": "each micro-batch planned in data order", "joint": "joint assignment",
                 "by_length": "documents grouped by length", "rounds": "documents packed as dynamic CP's rounds"}


def _x(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _tokens(n: int) -> str:
    return f"{n >> 20}M" if n % (1 << 20) == 0 else f"{n >> 10}K" if n % (1 << 10) == 0 else str(n)


def _table(header: List[str], rows: List[List[str]]) -> List[str]:
    return (["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
            + ["| " + " | ".join(r) + " |" for r in rows])


def _row(name: str, s: Dict) -> List[str]:
    return [name, _x(s["mean_speedup"]), _x(s["geomean_speedup"]), _x(s["min_speedup"]), _x(s["max_speedup"]),
            str(s["configs"]), str(len(s["losses"]))]


def _aim(s: Dict) -> str:
    m = s["mean_speedup"]
    if m is None:
        return "-"
    return f"{'meets it' if m >= AIM_MEAN else 'below it'} ({_x(m)} measured)"


def render(h: Dict) -> List[str]:
    """The headline section's Markdown lines (the report's first section)."""
    from megatron_zeppelin.spec.config import DEFAULT_ACCUMULATION
    lo, hi = (_tokens(x) for x in GLOBAL_BATCH_TOKENS)
    L = [f"## Headline: Zeppelin against the best deployed baseline, {lo}-{hi}-token global batches with "
         "gradient accumulation", ""]
    if not h["configs"]:
        return L + [f"No run in this report is a {lo}-{hi}-token global batch of several micro-batches (the "
                    "studies with `global_batch_tokens`, e.g. `accumulation`, did not run for it): the headline "
                    "has nothing to show; the regime summaries below are what this report measures.", ""]
    L += [f"{h['configs']} configurations, each a run of batches that are iterations of a "
          f"{', '.join(_tokens(g) for g in h['global_batches'])}-token global batch split into micro-batches "
          "and gradient-accumulated (Megatron's `--global-batch-size`), without pipeline stages (those are in "
          "their study's section). Per configuration: the fastest baseline as deployed (its run-level settings "
          "fixed for the run; Zeppelin's own variants are not baselines), its mean simulated iteration over "
          f"Zeppelin's (`zeppelin`: as the plugin runs by default, {ASSIGNED_ROWS[DEFAULT_ACCUMULATION.value]}, "
          f"`--zeppelin-accumulation {DEFAULT_ACCUMULATION.value}`). MHA: kv_heads = heads; GQA: fewer K/V heads.",
          ""]
    g = h["groups"]
    rows = [_row(f"{k} models", g[k]) for k in KINDS if g[k]["configs"]] + [_row("all", g["all"])]
    for how, words in ASSIGNED_ROWS.items():
        if h.get(how):
            rows.append(_row(f"all, Zeppelin with {words} (`zeppelin+{how}`)", h[how]["all"]))
    L += _table(["models", "speedup: mean", "geomean", "min", "max", "configs", "Zeppelin slower in"], rows)
    if h["datasets"]:
        L += ["", f"Long-context mixes at {LONG_CONTEXT_TOKENS >> 10}K beside issue 49's aim, a mean speedup of "
                  f"at least {AIM_MEAN:.2f}x over the best deployed baseline (the aim is stated, not tested: "
                  "this is what the simulator measures):", ""]
        drows = []
        for ds, x in h["datasets"].items():
            name = "the three together" if ds == "together" else ds
            drows.append([name] + [_x(x[k]["mean_speedup"]) for k in KINDS] + _row("", x["all"])[1:6]
                         + [_aim(x["all"])])
        L += _table(["dataset", "MHA: mean", "GQA: mean", "all: mean", "geomean", "min", "max", "configs",
                     f"aim: mean >= {AIM_MEAN:.2f}x"], drows)
    lb = h["lower_bound"]
    if lb:
        L += ["", f"Zeppelin / lower bound over these configurations: mean {lb['mean']:.3f} (goal <= "
                  f"{LOWER_BOUND_GOAL[0]:.2f}), max {lb['max']:.3f} (goal <= {LOWER_BOUND_GOAL[1]:.2f})."]
    n = len(h["losses"])
    which = (": " + "; ".join(f"{l['label']} ({l['baseline']} faster, speedup {l['speedup']:.3f}x)"
                              for l in h["losses"])) if n else "."
    L += ["", f"Zeppelin slower than the best deployed baseline in {n} configuration{'s' if n != 1 else ''}{which}"]
    if h["best_of"]:
        L += ["", "The best deployed baseline, per configuration: "
                  + ", ".join(f"{v} in {c}" for v, c in h["best_of"].items()) + "."]
    if h["no_baseline"]:
        L += ["", f"No baseline completed (none ran, or none fits) in {len(h['no_baseline'])} of them, not in "
                  f"the speedups: {'; '.join(h['no_baseline'])}."]
    return L + [""]

