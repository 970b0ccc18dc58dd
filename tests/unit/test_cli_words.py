"""What plan, simulate and demo say (issue 56 items 16 and 17): a fixed-shape Zeppelin plan says what
was planned, no float noise, one default cluster, plot labels off the bars, the demo leads with balance."""

import matplotlib.figure
import pytest

from megatron_zeppelin.cli import build_parser, main


def _defaults(command):
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices[command].parse_args([])


def test_a_fixed_shape_zeppelin_plan_says_what_was_planned(capsys):
    # On this batch no whole-document plan beats hybrid_dp's shape, which Zeppelin then takes.
    rc = main(["plan", "--dataset", "prolong64k", "--cluster", "a800", "--model", "llama-7b", "--nodes", "2",
               "--global-batch-tokens", "128K", "--recompute", "none"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "planned: Zeppelin took the fixed shape hybrid_dp (no whole-document plan of its own" in out
    assert "cost-model crossovers, not class boundaries" not in out and "always stay whole" not in out


def test_float_noise_prints_as_zero():
    from megatron_zeppelin.reports.plan import _s
    assert _s(8.881784197001252e-16) == "0" and _s(-1e-17) == "0" and _s(2.5e-6) == "2.5e-06"


def test_one_default_cluster_across_commands():
    clusters = {c: _defaults(c).cluster for c in ("plan", "simulate", "advise")}
    assert set(clusters.values()) == {"h200"}, clusters
    from megatron_zeppelin.integration.args import add_zeppelin_args  # the Megatron-LM entry's flag
    import argparse
    p = argparse.ArgumentParser()
    add_zeppelin_args(p)
    assert p.parse_args([]).zeppelin_cluster == "h200"


def test_plot_labels_do_not_sit_on_the_bars(tmp_path, monkeypatch):
    figures = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: (figures.append(self),
                                                                                   real(self, *a, **k)))
    png = tmp_path / "p.png"
    assert main(["plan", "--model", "tiny", "--cluster", "h200", "--gpus-per-node", "4", "--nodes", "2",
                 "--global-batch-tokens", "24K", "--context-length", "4K", "--dataset", "github", "--compare",
                 "--plot", str(png)]) == 0
    fig = figures[-1]
    hist, _, strategies = [a for a in fig.axes if a.get_xlabel()][:3]
    assert not hist.texts  # the crossovers are named in the legend, not written over the histogram
    lines = [ln for ln in hist.get_lines() if ln.get_label().startswith("may split intra from")]
    lo, hi = hist.get_xlim()
    assert all(lo < ln.get_xdata()[0] < hi for ln in lines)  # a crossover drawn is a named line in range
    bars = strategies.patches
    assert len(strategies.texts) == len(bars) > 0
    for bar, text in zip(bars, strategies.texts):  # each label starts past its bar's end
        assert text.get_position()[0] > bar.get_width() and text.get_ha() == "left"


def test_demo_table_leads_with_compute_balance():
    from megatron_zeppelin.commands.demo import table
    row = {"final_loss": 5.0, "tokens_per_s": 1234.0, "compute_max_over_mean": 1.05, "pred_imbalance": 1.01,
           "mb_inter_node": 1.0, "mb_intra_node": 2.0}
    head, _, line = table({"zeppelin": row}).splitlines()
    assert head.split()[1:3] == ["compute", "max/mean"] and head.rstrip().endswith("CPU tokens/s")
    assert line.split()[1] == "1.050" and line.split()[-1] == "1234"


@pytest.mark.parametrize("warnings, kept", [([], ""), (["GEMM (1, 2): repeats varied 5.0x"], "cost model: kept")])
def test_demo_says_a_noisy_profile_was_kept_and_what_it_means(warnings, kept):
    from megatron_zeppelin.commands.demo import noisy_profile_note
    note = noisy_profile_note(warnings)
    assert (kept in note) if kept else note == ""
    if kept:
        assert "repeats varied 5.0x" in note and "'pred imb'" in note and "'compute max/mean' is measured" in note
