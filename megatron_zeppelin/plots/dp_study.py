"""Plots of ``zeppelin compare-dp`` (one PNG per question, per model): loss against step and against
time, speedup and scaling efficiency, exposed communication and bytes per step, peak memory per
rank by category. Rows come from reports/dp_study.py's summarize (which imports this module: the
memory categories are the ones its rows carry)."""

from __future__ import annotations

import os
from typing import Dict, List

LABELS = {"param": "parameters", "grad": "gradients", "opt": "optimizer states", "act": "activations"}


def _fig(n=1, w=6.0, h=4.0):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, n, figsize=(w * n, h), squeeze=False, constrained_layout=True)
    return plt, fig, axes[0]


def _label(r) -> str:
    return f"{r['variant']} W={r['world']}" + (" bal" if r["balance"] else "")


def plot_all(rows: List[dict], out_dir: str) -> Dict[str, str]:
    paths = {}
    for model in sorted({r["model"] for r in rows}):
        rs = [r for r in rows if r["model"] == model]
        tag = model or "model"
        paths[f"loss_{tag}"] = _loss(rs, os.path.join(out_dir, f"compare_dp_{tag}_loss.png"), tag)
        paths[f"scaling_{tag}"] = _scaling(rs, os.path.join(out_dir, f"compare_dp_{tag}_scaling.png"), tag)
        paths[f"comm_{tag}"] = _comm(rs, os.path.join(out_dir, f"compare_dp_{tag}_comm.png"), tag)
        paths[f"memory_{tag}"] = _memory(rs, os.path.join(out_dir, f"compare_dp_{tag}_memory.png"), tag)
    return paths


def _loss(rows, path, model):
    plt, fig, (a, b) = _fig(2)
    for r in rows:
        t = [sum(r["step_times"][:i + 1]) for i in range(len(r["step_times"]))]
        a.plot(range(1, len(r["losses"]) + 1), r["losses"], alpha=0.7, label=_label(r))
        b.plot(t, r["losses"], alpha=0.7, label=_label(r))
    a.set(title=f"{model}: loss against step", xlabel="step (global batch)", ylabel="loss")
    b.set(title=f"{model}: loss against wall time (CPU, under load)", xlabel="seconds", ylabel="loss")
    a.legend(fontsize=6, ncol=2)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _scaling(rows, path, model):
    plt, fig, (a, b) = _fig(2)
    for v in dict.fromkeys(r["variant"] for r in rows if r["variant"] != "single"):
        for bal in sorted({r["balance"] for r in rows}):
            rs = sorted((r for r in rows if r["variant"] == v and r["balance"] == bal and r["speedup"]),
                        key=lambda r: r["world"])
            if rs:
                lab = v + (" bal" if bal else "")
                a.plot([r["world"] for r in rs], [r["speedup"] for r in rs], marker="o", label=lab)
                b.plot([r["world"] for r in rs], [r["efficiency"] for r in rs], marker="o", label=lab)
    ws = sorted({r["world"] for r in rows})
    a.plot(ws, ws, "k--", lw=0.8, label="ideal")
    a.set(title=f"{model}: speedup over one plain process", xlabel="ranks", ylabel="speedup", xticks=ws)
    b.set(title=f"{model}: scaling efficiency (speedup / ranks)", xlabel="ranks", ylabel="efficiency", xticks=ws)
    a.legend(fontsize=6)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(ax, rows, value, title, ylabel):
    rows = [r for r in rows if r["variant"] != "single"]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    keys = sorted({(r["balance"], r["world"]) for r in rows})
    width = 0.8 / max(1, len(keys))
    for k, (bal, w) in enumerate(keys):
        vals = [next((value(r) for r in rows if r["variant"] == v and r["world"] == w and r["balance"] == bal), 0)
                for v in variants]
        ax.bar([i + k * width for i in range(len(variants))], vals, width, label=f"W={w}" + (" bal" if bal else ""))
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(variants))], variants, rotation=20)
    ax.set(title=title, ylabel=ylabel)
    ax.legend(fontsize=7)


def _comm(rows, path, model):
    plt, fig, (a, b) = _fig(2)
    _bars(a, rows, lambda r: r["exposed_comm_s"] * 1e3, f"{model}: exposed communication after backward",
          "ms per step (median)")
    _bars(b, rows, lambda r: r["comm_sent_bytes"] / 1e6, f"{model}: bytes sent per rank per step (ring)", "MB")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _memory(rows, path, model):
    plt, fig, (ax,) = _fig(1, w=10)
    rows = [r for r in rows if not r["balance"]] or rows
    xs = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for c in dict.fromkeys(c for r in rows for c in r["mem_by_category"]):  # the rows' categories, in order
        vals = [r["mem_by_category"].get(c, 0) / 1e6 for r in rows]
        ax.bar(xs, vals, 0.7, bottom=bottom, label=LABELS.get(c, c))
        bottom = [x + y for x, y in zip(bottom, vals)]
    ax.scatter(xs, [r["mem_predicted_bytes"] / 1e6 for r in rows], color="k", marker="_", s=200, zorder=3,
               label="predicted total (memory.py)")
    ax.set_xticks(xs, [_label(r) for r in rows], rotation=60, fontsize=7)
    ax.set(title=f"{model}: peak tracked memory per rank by category", ylabel="MB")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
