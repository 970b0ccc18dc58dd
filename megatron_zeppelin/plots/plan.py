"""The ``zeppelin plan --plot`` figure: the batch's lengths with the classes the plan chose and the cost
model's crossovers (dashed), and what each rank is predicted to spend (from ``Plan.cost``)."""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from megatron_zeppelin.spec.words import DocClass

PARTS = (("attention_s", "attention", "#4C72B0"), ("linear_s", "linear", "#55A868"),
         ("comm_exposed_s", "exposed comm", "#C44E52"), ("remap_s", "remap", "#8172B2"))
CLASS_COLOR = {DocClass.LOCAL: "#DDEEFF", DocClass.INTRA: "#FFF2CC", DocClass.INTER: "#F8D7DA"}


def _matplotlib():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_plan(path: str, lengths, plan, compare: Optional[Dict[str, object]] = None,
              title: Optional[str] = None, iteration=None) -> None:
    """Write a PNG: length histogram with thresholds; per-rank stacked bars of ``plan`` (one step); with
    ``compare`` ({strategy: Iteration, Plan or reason}) also each strategy's predicted iteration (the
    steps and the DP all-reduce) against the lower bound of ``iteration`` (the shown strategy's)."""
    plt = _matplotlib()
    n = 3 if compare else 2
    fig, axes = plt.subplots(n, 1, figsize=(12, 3.6 * n), constrained_layout=True)
    _histogram(axes[0], np.asarray(lengths), plan)
    _rank_bars(axes[1], plan)
    if compare:
        _strategies(axes[2], compare, (iteration or plan).lower_bound_s, iteration is not None)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def _histogram(ax, x: np.ndarray, plan) -> None:
    lo, hi = max(1, int(x.min())), int(x.max())
    bins = np.logspace(np.log10(lo), np.log10(hi + 1), 40) if hi > lo else np.array([lo - 0.5, hi + 0.5])
    th = plan.thresholds
    # Shade the span of lengths each class actually holds in this plan (a class with no document gets
    # no shade): the thresholds are crossovers where splitting may pay, not the classes' boundaries.
    for c in (DocClass.LOCAL, DocClass.INTRA, DocClass.INTER):
        ls = [d.length for d in plan.docs if d.cls == c]
        if ls:
            ax.axvspan(min(ls) * 0.97, max(ls) * 1.03, color=CLASS_COLOR[c], alpha=0.6, lw=0,
                       label=f"{c}: {len(ls)} documents, {min(ls)}-{max(ls)} tokens")
    ax.hist(x, bins=bins, color="#4C72B0", alpha=0.9, label="documents")
    ax.set_xscale("log")
    ax.set_yscale("log")  # the long tail is a handful of documents: keep them visible
    ax.set_ylim(bottom=0.7)
    ax.set_xlabel("document length (tokens)")
    ax.set_ylabel("documents (log)")
    tw = ax.twinx()  # where the tokens (and the quadratic attention work) are
    tok, _ = np.histogram(x, bins=bins, weights=x)
    tw.step(bins[1:], np.cumsum(tok) / tok.sum(), where="pre", color="#DD8452", label="cumulative token share")
    tw.set_ylim(0, 1.02)
    tw.set_ylabel("cumulative share of tokens")
    crossovers = plan.strategy.startswith("zeppelin") and not plan.meta.shape  # a fixed shape has none
    marks = [(th.local_max + 1, "may split intra from", "--")] if crossovers else []
    if marks and plan.topology.nodes > 1:
        marks.append((th.intra_max + 1, "may span nodes from", ":"))
    for v, name, style in marks:  # crossovers of the cost model, named in the legend (a label over the
        if bins[0] < v < bins[-1]:  # bars would hide them)
            ax.axvline(v, color="k", ls=style, lw=1.2, label=f"{name} {v} tokens (cost-model crossover)")
    cc = plan.class_counts()
    ax.set_title(f"{len(x)} documents; {plan.strategy}: {cc['local']} local, {cc['intra']} intra, "
                 f"{cc['inter']} inter", fontsize=10)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = tw.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left", bbox_to_anchor=(1.1, 1.0))  # past the twin axis label


def _rank_bars(ax, plan) -> None:
    ranks = np.arange(plan.world_size)
    bottom = np.zeros(plan.world_size)
    for field, label, color in PARTS:
        v = np.array([getattr(c, field) for c in plan.cost])
        ax.bar(ranks, v, bottom=bottom, color=color, label=label, width=0.85)
        bottom += v
    ax.axhline(plan.lower_bound_s, color="k", ls="--", lw=1, label=f"lower bound {plan.lower_bound_s:.3g} s")
    g = plan.topology.gpus_per_node
    for b in range(g, plan.world_size, g):  # node boundaries
        ax.axvline(b - 0.5, color="grey", lw=0.6, alpha=0.6)
    ax.set_xlim(-0.6, plan.world_size - 0.4)
    ax.set_xlabel(f"rank ({plan.topology.nodes} node(s) x {g} GPUs; grey lines = node boundaries)")
    ax.set_ylabel("predicted s / step")
    ax.set_title(f"{plan.strategy}: predicted step {plan.predicted_iteration_s:.3g} s (one global micro-batch), imbalance "
                 f"{plan.imbalance:.3f}, {plan.predicted_iteration_s / plan.lower_bound_s:.3f}x lower bound",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _strategies(ax, plans: Dict[str, object], lower_bound: float, whole: bool = False) -> None:
    names = [n for n, p in plans.items() if not isinstance(p, str)]
    vals = [plans[n].predicted_iteration_s for n in names]
    y = np.arange(len(names))
    bars = ax.barh(y, vals, height=0.6, color=["#C44E52" if n == "zeppelin" else "#8C8C8C" for n in names])
    right = max(vals + [lower_bound])
    for b, v in zip(bars, vals):  # the label sits past the bar's end, in the margin kept for it
        ax.text(v + right * 0.01, b.get_y() + b.get_height() / 2, f"{v:.3g} s ({v / lower_bound:.2f}x)",
                va="center", ha="left", fontsize=8)
    ax.axvline(lower_bound, color="k", ls="--", lw=1, label=f"lower bound {lower_bound:.3g} s")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlim(0, right * 1.3)
    ax.set_xlabel("predicted iteration s (slowest rank" + (", every step, then the DP all-reduce)" if whole else ")"))
    missing = [n for n, p in plans.items() if isinstance(p, str)]
    ax.set_title("strategies on the same batch" + (f" (not planned: {', '.join(missing)})" if missing else ""),
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
