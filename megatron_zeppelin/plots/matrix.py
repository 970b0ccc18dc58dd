"""Figures of the simulator: per-rank Gantt chart of one layer, speedup bars, scaling lines.
matplotlib is imported inside each function (slow to import, and only needed when plotting)."""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Sequence

COLORS = {"linear": "#4c72b0", "attn_local": "#55a868", "attn_intra": "#c44e52", "attn_inter": "#8172b2",
          "tp_comm": "#937860", "head": "#64b5cd", "ring_intra": "#dd8452", "ring_inter": "#da8bc3",
          "remap": "#8c8c8c"}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def gantt(result, path: str, title: str = "", max_ranks: int = 32) -> None:
    """One layer's forward then backward: per rank a compute row and a row of the messages it sends."""
    plt = _plt()
    ranks = sorted({e[0] for e in result.timeline})[:max_ranks]
    fig, ax = plt.subplots(figsize=(14, 0.5 * len(ranks) + 1.5))
    seen = set()
    for rank, cat, label, s, e in result.timeline:
        if rank not in ranks:
            continue
        comm = cat.startswith("ring") or cat == "remap"
        y = ranks.index(rank) + (0.42 if comm else 0.0)
        ax.barh(y, (e - s) * 1e3, left=s * 1e3, height=0.38, color=COLORS.get(cat, "#333333"),
                label=None if cat in seen else cat, alpha=0.6 if comm else 1.0)
        seen.add(cat)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("ms (one layer: forward, then backward); upper bar: compute, lower: messages sent")
    ax.set_title(title or f"iteration {result.iteration_s:.3f} s ({result.layers} layers)")
    ax.legend(loc="upper right", fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


BARS_PER_ROW = 24  # configurations per panel of speedup_bars


def speedup_bars(records: Sequence[Dict], path: str, study: str = "main") -> None:
    """Zeppelin's speedup over each baseline, per configuration (cluster/model/dataset); Zeppelin's own
    variants (sim/runs.py ABLATIONS: joint assignment, the partitioner alone, ...) in panels of their
    own below, never among the baselines' bars."""
    from megatron_zeppelin.sim.runs import ABLATIONS
    plt = _plt()
    by_key: Dict[str, Dict[str, float]] = defaultdict(dict)
    labels: Dict[str, str] = {}
    for r in records:
        if r["study"] == study and not r.get("error") and r.get("iteration_s"):
            by_key[r["key"]][r["variant"]] = r["iteration_s"]
            labels[r["key"]] = r.get("label") or r["key"]
    keys = [k for k in sorted(by_key) if "zeppelin" in by_key[k]]
    if not keys:
        return
    others = sorted({v for k in keys for v in by_key[k] if v != "zeppelin"})
    groups = [(name, vs) for name, vs in (
        ("baselines as deployed", [v for v in others if v not in ABLATIONS]),
        ("Zeppelin's own variants (not baselines)", [v for v in others if v in ABLATIONS])) if vs]
    if not groups:
        return
    rows = [keys[i:i + BARS_PER_ROW] for i in range(0, len(keys), BARS_PER_ROW)]  # wide studies: stacked panels
    panels = [(name, vs, row) for name, vs in groups for row in rows]
    width = max(8, 0.45 * len(rows[0]) * max(len(vs) for _, vs in groups) / 3)
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, 4.5 * len(panels)), squeeze=False)
    colour = {v: f"C{j}" for j, v in enumerate(others)}  # one colour per variant in every panel
    for n, (ax, (name, bases, row)) in enumerate(zip(axes[:, 0], panels)):
        w = 0.8 / len(bases)
        for j, b in enumerate(bases):
            xs = [i + j * w for i, k in enumerate(row) if b in by_key[k]]
            ys = [by_key[k][b] / by_key[k]["zeppelin"] for k in row if b in by_key[k]]
            ax.bar(xs, ys, width=w, label=b, color=colour[b])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(row))])
        ax.set_xticklabels([labels[k] for k in row], rotation=70, fontsize=7, ha="right")
        ax.set_xlim(-0.3, (BARS_PER_ROW if len(rows) > 1 else len(row)) - 0.1)
        ax.set_ylabel(f"speedup of Zeppelin\n({'variant' if name.startswith('Zeppelin') else 'baseline'} time / "
                      "Zeppelin time)")
        if n == 0 or panels[n - 1][0] != name:  # each group's first panel: its title and legend
            ax.set_title(f"study '{study}': mean simulated iteration over each run, {name}")
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend beside each group's first panel
    plt.close(fig)


def scaling_lines(records: Sequence[Dict], path: str, study: str = "scaling") -> None:
    """Throughput (tokens/s) against GPUs, one panel per dataset, one line per variant."""
    plt = _plt()
    recs = [r for r in records if r["study"] == study and not r.get("error") and r.get("iteration_s")]
    if not recs:
        return
    datasets = sorted({r["dataset"] for r in recs})
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.5 * len(datasets), 3.8), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        lines: Dict[str, List] = defaultdict(list)
        for r in recs:
            if r["dataset"] == ds:
                lines[r["variant"]].append((r["ranks"] * r["tp"], r["tokens"] / r["iteration_s"]))
        for v, pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("tokens / s")
        ax.set_title(ds)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
