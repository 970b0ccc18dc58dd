"""docs/results.md from a bench results document (``zeppelin bench --json``): tables and figures.

>>> fmt_speed(2.3456), fmt_s(0.01234)
('2.35x', '0.0123')
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional

from megatron_zeppelin.reports.joint import joint_line
from megatron_zeppelin.reports.pipeline import pipeline_section


def fmt_speed(x: float) -> str:
    return f"{x:.2f}x"


def fmt_s(x: float) -> str:
    return f"{x:.4f}" if x < 1 else f"{x:.3f}"


def _table(header: List[str], rows: List[List[str]]) -> List[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _x(v) -> str:
    return "-" if v is None else fmt_speed(v)


def _summary_table(s: dict) -> List[str]:
    from megatron_zeppelin.sim.matrix import BEST, baselines
    rows = []
    for b, x in baselines(s["summary"]).items():
        d, o = x["deployed"], x["oracle"]
        name = b if b != BEST else "best deployed baseline, per configuration (" + ", ".join(
            f"{v} {n}" for v, n in x.get("best_of", {}).items()) + ")"
        rows.append([name, _x(d["mean_speedup"]), _x(d["geomean_speedup"]), _x(d["max_speedup"]), _x(d["min_speedup"]),
                     str(d["configs"]), str(len(d["losses"])), str(x.get("out_of_memory", 0)),
                     _x(o["mean_speedup"]), _x(o["max_speedup"]), _x(o["min_speedup"]), str(o["configs"]),
                     str(len(o["losses"])),
                     f"{x['lower_bound_ratio']:.2f}" if x.get("lower_bound_ratio") else "-"])
    lines = _table(["baseline", "deployed: mean speedup", "geomean", "max", "min", "configs", "Zeppelin slower in",
                    "no fixed setting fits (OOM)", "oracle: mean speedup", "max", "min", "configs",
                    "Zeppelin slower in", "deployed baseline / lower bound (mean)"], rows)
    for b, x in baselines(s["summary"]).items():
        h = x.get("not_deployable")
        if h:
            lines += ["", f"Not deployable, so in neither column above: {b} in {h['configs']} configurations "
                          f"({h['why']}). Simulated as if it ran them, Zeppelin's speedup over it would be "
                          f"{_x(h['mean_speedup'])} mean, {_x(h['min_speedup'])} min, {_x(h['max_speedup'])} max, "
                          f"slower in {len(h['losses'])}" + (": " + ", ".join(
                              f"{k} ({v:.3f}x)" for k, v in zip(h["losses"], h["loss_speedups"])) if h["losses"]
                              else "") + "."]
    lines += _ablation_table(s)
    lb = s["summary"].get("zeppelin_lower_bound")
    if lb:
        lines += ["", f"Zeppelin's mean simulated iteration / lower bound: mean {lb['mean']:.3f}, "
                      f"max {lb['max']:.3f} over {lb['configs']} configurations."]
    if s.get("balance"):
        lines += ["", "Imbalance of the plans, max / mean over ranks (mean over configurations; memory: per-rank "
                      "peak activation memory, attention and linear layouts, with the run's recompute):", ""]
        lines += _table(["strategy", "time", "memory", "memory (worst)", "configs"],
                        [[v, f"{x['time_imbalance']:.2f}", f"{x['memory_imbalance']:.2f}",
                          f"{x['memory_imbalance_max']:.2f}", str(x["configs"])] for v, x in s["balance"].items()])
    return lines


def _ablation_table(s: dict) -> List[str]:
    """Zeppelin against its own variants (sim/runs.py ABLATIONS), apart from the baselines: what the
    part a variant lacks or adds is worth, never a baseline Zeppelin is claimed to beat."""
    from megatron_zeppelin.sim.matrix import ablations
    rows = [[v, _x(d["mean_speedup"]), _x(d["geomean_speedup"]), _x(d["min_speedup"]), _x(d["max_speedup"]),
             str(d["configs"]), str(len(d["losses"]))]
            for v, d in ((v, x["deployed"]) for v, x in ablations(s["summary"]).items())]
    if not rows:
        return []
    return ["", "Zeppelin's own variants (not baselines): Zeppelin's speedup over each, its mean simulated iteration "
                "over Zeppelin's (below 1.00x: the variant is faster):", ""] + _table(
        ["variant", "mean", "geomean", "min", "max", "configs", "variant faster in"], rows)


def _per_config(runs: List[dict], study: str, variants: List[str]) -> List[str]:
    from megatron_zeppelin.sim.runs import ABLATIONS
    by: Dict[str, Dict[str, dict]] = defaultdict(dict)
    for r in runs:
        if r["study"] == study:
            by[r["key"]][r["variant"]] = r
    rows = []
    for key in sorted(by):
        vs = by[key]
        z = vs.get("zeppelin")
        z = z if z and z.get("iteration_s") else None
        any_r = next(iter(vs.values()))
        label = any_r.get("label") or key
        if any_r.get("recompute", "none") != "none" and not any_r.get("recompute_per_strategy"):
            label += f" rc={any_r['recompute']}"
        cells = []
        for v in variants:
            r = vs.get(v)
            if r is None:
                cells.append("-")
                continue
            cell = fmt_s(r["iteration_s"]) if r.get("iteration_s") else "OOM"
            if r.get("run_setting"):
                cell += f" ({'cp' if r.get('run_setting_name') == 'cp_size' else 'mslpr '}{r['run_setting']})"
            if r.get("recompute_per_strategy") and r.get("iteration_s"):  # each strategy's own recompute
                cell += f" rc={r['recompute']}"
            if r.get("oracle_iteration_s") and (not r.get("iteration_s") or r["oracle_iteration_s"] < r["iteration_s"] * 0.9995):
                cell += f" / {fmt_s(r['oracle_iteration_s'])}"
            cells.append(cell)
        base = [r["iteration_s"] for v, r in vs.items()  # the baselines only: Zeppelin's own variants are not
                if v != "zeppelin" and v not in ABLATIONS and r.get("iteration_s") and not r.get("error")]
        sp = fmt_speed(min(base) / z["iteration_s"]) if z and base else "-"
        lb = f"{z['iteration_s'] / z['lower_bound_s']:.3f}" if z else "-"
        bal = f"{z['time_imbalance']:.2f} / {z['memory_imbalance']:.2f}" if z and "memory_imbalance" in z else "-"
        rows.append([label] + cells + [sp, lb, bal])
    return _table(["configuration"] + variants + ["vs best deployed baseline", "Zeppelin / LB",
                                                   "Zeppelin imbalance time / memory"], rows)


def _losses(doc: dict) -> List[str]:
    from megatron_zeppelin.sim.matrix import BEST, baselines
    out = []
    for b, x in baselines(doc["summary"]).items():
        if b == BEST:  # each of its losses is listed under the baseline that was faster
            continue
        for col in ("deployed", "oracle"):
            c = x[col]
            for k, sp in zip(c["losses"], c.get("loss_speedups", [None] * len(c["losses"]))):
                by = f" (Zeppelin's speedup {sp:.3f}x)" if sp is not None else ""
                out.append(f"- {k}: {b} ({col}) is faster than Zeppelin{by}")
    return out or ["- none: Zeppelin is at least as fast as every baseline, deployed and oracle, in every configuration"]


def _against_default(runs: List[dict], study: str) -> List[str]:
    """For a study planning Zeppelin with --zeppelin-balance-memory: its Zeppelin against the default
    Zeppelin of the same configurations (the same batches) in the report's other studies."""
    def same(r):
        return tuple(r.get(k) for k in ("cluster", "model", "tp", "dataset", "context", "nodes", "tokens_per_gpu",
                                         "capacity", "recompute", "seed", "batches"))
    ok = [r for r in runs if r["variant"] == "zeppelin" and r.get("iteration_s") and not r.get("error")]
    mine = [r for r in ok if r["study"] == study and r.get("balance_memory")]
    default = {same(r): r for r in ok if not r.get("balance_memory")}
    pairs = [(default[same(r)], r) for r in mine if same(r) in default]
    if not pairs:
        return []
    t = sorted(b["iteration_s"] / a["iteration_s"] for a, b in pairs)
    m0, m1 = [a["memory_imbalance"] for a, _ in pairs], [b["memory_imbalance"] for _, b in pairs]
    return ["", f"Against the default Zeppelin of the same {len(pairs)} configurations (the same batches, in the other "
            f"studies): mean simulated iteration x{sum(t) / len(t):.4f} (median x{t[len(t) // 2]:.4f}, max "
            f"x{t[-1]:.4f}, min x{t[0]:.4f}); memory max / mean {sum(m0) / len(m0):.3f} -> {sum(m1) / len(m1):.3f} "
            f"(worst {max(m0):.3f} -> {max(m1):.3f})."]


def _attribution(studies: Dict[str, dict]) -> List[str]:
    """Per study: how many of Zeppelin's plans each kind of candidate won (sim/attribution.py), and
    Zeppelin's speedup over the paper's partitioner alone (the ``zeppelin-partitioner`` variant)."""
    from megatron_zeppelin.sim.attribution import KINDS
    from megatron_zeppelin.sim.runs import PARTITIONER
    kinds = list(KINDS) + sorted({k for s in studies.values() for k in s.get("attribution", {}).get("won", {})
                                  if k not in KINDS})
    rows = []
    for study, s in studies.items():
        a = s.get("attribution") or {}
        if not a.get("plans"):
            continue
        won = a["won"]
        p = (s["summary"].get(PARTITIONER) or {}).get("deployed") or {}
        alone = (f"{_x(p['mean_speedup'])} (min {_x(p['min_speedup'])}, max {_x(p['max_speedup'])}, "
                 f"{p['configs']} configs)" if p.get("configs") else "-")
        rows.append([study] + [str(won.get(k, 0)) for k in kinds] + [str(a["plans"]), alone])
    if not rows:
        return []
    return ["Which candidate won each of Zeppelin's plans (a plan per batch and micro-batch; "
            "sim/attribution.py): the paper's partitioner (free or aligned rings), or a shape of the portfolio "
            "run by Zeppelin's engine: every document on CP groups of one size (`packed (cp1)`: no ring; "
            "p2p zigzag rings, routed or not; a2a), hybrid_dp's or dynamic_cp's groups. The last column: "
            "the partitioner alone (no portfolio) against the full search, Zeppelin's speedup over it in "
            "simulated mean iteration (1.00x: the portfolio gains nothing there).", ""] + _table(
        ["study"] + kinds + ["plans", "Zeppelin / partitioner alone"], rows)


def _robustness(runs: List[dict], study: str) -> List[str]:
    """The robustness study's speedups under a wrong profile and where Zeppelin then loses (sim/robustness.py)."""
    from megatron_zeppelin.sim.matrix import BEST
    from megatron_zeppelin.sim.robustness import LOSS_MARGIN, robustness
    mine = [r for r in runs if r["study"] == study]
    if not any(r.get("profile_error") for r in mine):
        return []
    s = robustness(mine)
    err = max(r.get("profile_error", 0.0) for r in mine)
    rows = []
    for v, x in s["speedups"].items():
        t, e = x["true"] or {}, x["error"] or {}
        rows.append([("best deployed baseline" if v == BEST else v), _x(t.get("mean")), _x(t.get("worst")),
                     _x(e.get("mean")), _x(e.get("worst")), str(e.get("runs", 0))])
    L = ["", f"Every strategy planned with a profile off by up to +-{100 * err:g}% per measured term (attention "
             "rates, GEMM rate, NVLink and NIC bandwidth) and by a factor between 0 and 2 per term the GPU presets "
             "assume (contention: the SM contention of overlapped NCCL kernels; overheads: the kernel-call launch "
             "and per-message costs), each its own seeded factor (sim/perturb.py), simulated with the true "
             f"profile; {s['runs']} perturbed runs. Zeppelin's speedup (deployed):", ""]
    L += _table(["baseline", "true profile: mean", "worst", "under error: mean", "worst", "runs"], rows)
    L += ["", "Where Zeppelin then loses to the best deployed baseline:", ""]
    for l in s["losses"]:
        f = ", ".join(f"{k} x{v:.2f}" for k, v in l["factors"].items())
        moved = (f"; Zeppelin's {l['moved']} moved most against the true profile's plan "
                 f"({l['moved_s']:+.4f} s; iteration {fmt_s(l['zeppelin_true_s'])} -> {fmt_s(l['zeppelin_s'])} s)"
                 if l.get("moved") else "")
        won = (f"; won by {l['won']} (true profile: {l['won_true']})" if l.get("won") else "")
        L.append(f"- {l['label']} (seed {l['seed']}: {f}): {l['baseline']} faster, Zeppelin's speedup "
                 f"{l['speedup']:.3f}x{moved}{won}")
        if l.get("terms"):
            L.append("  " + _loss_terms(l))
    if not s["losses"]:
        L.append("- none: under every perturbed profile Zeppelin is at least as fast as the best deployed baseline")
    beyond = [l for l in s["losses"] if l["speedup"] < 1.0 / (1.0 + LOSS_MARGIN)]
    L += ["", f"Zeppelin slower than the best deployed baseline by more than {100 * LOSS_MARGIN:g}% (issue 53's bound) "
              f"in {len(beyond)} of {s['runs']} perturbed runs" + (": " + "; ".join(
                  f"{l['label']} ({l['speedup']:.3f}x)" for l in beyond) if beyond else "") + "."]
    return L


def _loss_terms(loss: dict) -> str:
    """One loss replanned term by term (sim/loss_terms.py): Zeppelin's speedup over the same baseline."""
    from megatron_zeppelin.sim.loss_terms import verdict
    t = loss["terms"]

    def sp(x):
        return f"{t['baseline_s'] / x:.3f}x" if x else "-"
    alone = ", ".join(f"{k} {sp(v)}" for k, v in t["alone"].items())
    left = ", ".join(f"{k} {sp(v)}" for k, v in t["left_out"].items())
    return (f"Replanned term by term, simulated with the true profile, against the same {t['baseline']} "
            f"(sim/loss_terms.py): Zeppelin's speedup with one term's factor alone: {alone}; with one term "
            f"left true: {left}. So: " + verdict(t["alone"], t["left_out"], t["baseline_s"], loss["factors"],
                                                   loss["zeppelin_s"], loss["zeppelin_true_s"]) + ".")


def _gpu_terms(runs: List[dict], study: str) -> List[str]:
    """A study run with each GPU cost term off in turn (sim/gpu_terms.py): per term, Zeppelin's deployed
    mean speedup over each baseline and the best deployed one, its mean iteration and its ratio to the
    lower bound, so the page shows which term moves which speedup."""
    from megatron_zeppelin.sim.gpu_terms import NOTHING, TERMS
    from megatron_zeppelin.sim.matrix import BEST, baselines, summarize
    mine = [r for r in runs if r["study"] == study]
    if not any(r.get("gpu_term_off", NOTHING) != NOTHING for r in mine):
        return []
    terms = [t for t in TERMS if any(r.get("gpu_term_off", NOTHING) == t for r in mine)]
    sums = {t: summarize([r for r in mine if r.get("gpu_term_off", NOTHING) == t])["summary"] for t in terms}
    bases = sorted({b for s in sums.values() for b in baselines(s) if b != BEST})
    rows = []
    for t in terms:
        s = sums[t]
        zs = [r["iteration_s"] for r in mine
              if r.get("gpu_term_off", NOTHING) == t and r["variant"] == "zeppelin" and r.get("iteration_s")]
        lb = (s.get("zeppelin_lower_bound") or {}).get("mean")
        name = "every term on (the preset)" if t == NOTHING else "every term off" if t == "every" else f"{t} off"
        rows.append([name] + [_x(((s.get(b) or {}).get("deployed") or {}).get("mean_speedup")) for b in bases + [BEST]]
                    + [fmt_s(sum(zs) / len(zs)) if zs else "-", f"{lb:.3f}" if lb else "-"])
    configs = len({r["key"] for r in mine if r.get("gpu_term_off", NOTHING) == NOTHING})
    return ["", f"GPU cost terms (docs/simulator.md, \"GPU cost terms\"): the same {configs} configuration(s) with "
                "each term of the profile off in turn, in the plan and in the simulation alike (sim/gpu_terms.py: "
                "per_call, per-kernel-call pricing; full, the full-block tables; tile, the rate below the tile "
                "size; launch, the per-call launch cost; message, the per-message overhead; contention, the SM "
                "contention of overlapped NCCL kernels). Zeppelin's deployed mean speedup over each baseline, its "
                "mean iteration (s) and its ratio to the lower bound:", ""] + _table(
        ["profile"] + bases + ["best deployed baseline", "Zeppelin (s)", "Zeppelin / lower bound"], rows)


def _scaling(runs: List[dict], study: str = "scaling") -> List[str]:
    recs = [r for r in runs if r["study"] == study and not r.get("error") and r.get("iteration_s")]
    if not recs:
        return []
    variants = sorted({r["variant"] for r in recs}, key=lambda v: (v != "zeppelin", v))
    rows = []
    for ds in sorted({r["dataset"] for r in recs}):
        for g in sorted({r["ranks"] * r["tp"] for r in recs}):
            cells = []
            for v in variants:
                m = [r for r in recs if r["dataset"] == ds and r["ranks"] * r["tp"] == g and r["variant"] == v]
                cells.append(f"{m[0]['tokens'] / m[0]['iteration_s'] / 1e3:.1f}" if m else "-")
            rows.append([ds, str(g)] + cells)
    return _table(["dataset", "GPUs"] + [f"{v} (K tok/s)" for v in variants], rows)


def render(doc: dict, commands: List[str], figures: Dict[str, str], validation: Optional[dict] = None,
           notes: str = "", previous=None, made: str = "") -> str:
    """The page; ``previous``: (reports/previous.py digest of the previous report, its path), quoted
    beside this report's summary after the headline; ``made``: the one command that regenerates it and
    how long it took (`zeppelin bench --out-dir --report`)."""
    runs = doc["runs"]
    studies = doc.get("studies", {})
    from megatron_zeppelin.reports.headline import headline, render as render_headline
    L = ["# Results: Zeppelin vs the baselines on the simulator", "",
         "Generated by `zeppelin report`; do not edit by hand (the commands that made it follow the headline).", ""]
    if made:
        L += [made, ""]
    L += render_headline(doc.get("headline") or headline(runs))  # the report leads with it
    if previous:
        from megatron_zeppelin.reports.previous import digest, render as render_previous
        L += render_previous(previous[0], digest(doc), previous[1])
    L += ["## How these results were made", "", "Made with:", "", "```"] + commands + ["```", ""]
    if notes:
        L += [notes, ""]
    L += ["A configuration is a run of N batches sampled from its dataset. Speedup = the baseline's mean simulated "
          "iteration over the run / Zeppelin's. Two columns per baseline: *deployed*, its run-level settings "
          "(CP size; dynamic_cp's max_seqlen_per_dp_cp_rank) fixed for the whole run at the value with the least "
          "mean time among those that never run out of memory on any batch of the run, as a user must fix them; "
          "and *oracle*, tuned per batch, with hindsight (an upper bound on the baseline, not deployable). A "
          "baseline none of whose fixed settings fits every batch is counted under OOM. The last column, the "
          "deployed baseline's time over the lower bound, is the most any strategy could gain over it on average. "
          "In the per-configuration tables a cell is the deployed mean (its setting) / the oracle mean where lower.",
          ""]
    for title, part in doc.get("regimes", {}).items():
        L += [f"## Summary: {title}", ""] + _summary_table(part) + ["", "Where Zeppelin loses:", ""] + _losses(part)
        L += [""]
    L += ["## Summary: all studies together (but the ablations, whose baselines are not at their best setting, "
          "and `balance_memory`, whose Zeppelin trades time for memory)", ""]
    L += _summary_table(doc)
    L += ["", "### Where Zeppelin loses", ""] + _losses(doc)
    attrib = _attribution(studies)
    if attrib:
        from megatron_zeppelin.reports.partitioner_gaps import partitioner_gaps, render as render_gaps
        L += ["", "## Attribution: the partitioner or a baseline's shape", ""] + attrib
        L += [""] + render_gaps(partitioner_gaps(runs))
    first = ("accumulation", "accumulation_4m", "accumulation_70b", "pipeline", "memory", "memory_scaling",
             "ablation_memory", "main", "context", "scaling", "ablation")
    for study in [s for s in first if s in studies] + [s for s in studies if s not in first]:
        variants = sorted({r["variant"] for r in runs if r["study"] == study}, key=lambda v: (v != "zeppelin", v))
        L += ["", f"## Study `{study}`", "", "Speedup of Zeppelin over each baseline:", ""]
        L += _summary_table(studies[study])
        L += ["", "Mean simulated iteration time (s) over each run, deployed (setting) / oracle:", ""]
        L += _per_config(runs, study, variants)
        if "scaling" in study:
            L += ["", "Throughput:", ""] + _scaling(runs, study)
        L += joint_line(runs, study)
        L += pipeline_section(runs, study)
        L += _against_default(runs, study)
        L += _robustness(runs, study)
        L += _gpu_terms(runs, study)
        for name, path in figures.items():
            if name.split(": ")[-1] == study:  # "speedup bars: memory" is not ablation_memory's
                L += ["", f"![{name}]({path})"]
    for name, path in figures.items():
        if name.startswith("gantt"):
            L += ["", f"### Timeline: {name}", "", f"![{name}]({path})"]
    if validation:
        L += ["", "## Validation: simulator vs measured engine runs on this CPU", ""]
        L += [validation.get("note", "")]
        vrows = validation.get("rows", [])
        cpu = bool(vrows) and all("measured_cpu_s" in r for r in vrows)  # rows since 2026-12-02 have them
        speed = bool(vrows) and all("error_at_calibration" in r for r in vrows)  # since 2026-12-03 (validation set 10)
        rows = [[str(r["world"]), r["strategy"], f"{r['measured_s'] * 1e3:.1f}", f"{r['predicted_s'] * 1e3:.1f}",
                 f"{100 * (r['predicted_s'] / r['measured_s'] - 1):+.1f}%"]
                + ([f"{r['measured_cpu_s'] * 1e3:.1f}", f"{r['simulated_cpu_s'] * 1e3:.1f}",
                    f"{100 * (r['simulated_cpu_s'] / r['measured_cpu_s'] - 1):+.1f}%"] if cpu else [])
                + ([f"{100 * r['error_at_calibration']:+.1f}%"] if speed else [])
                for r in vrows]
        head = ["world", "strategy", "measured ms", "simulated ms", "error"]
        if cpu:  # all ranks' CPU time of a pass against the simulated pass's (validation/validate.py)
            head += ["measured CPU ms", "simulated CPU ms", "CPU error"]
        if speed:  # each repeat at the calibration's host speed (validation/host_speed.py)
            head += ["error at calibration speed"]
        L += [""] + _table(head, rows)
    return "\n".join(L) + "\n"
