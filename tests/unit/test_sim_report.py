"""`zeppelin report` from bench results: tables, figures, the commands that made them."""

import json

from megatron_zeppelin.cli import main

from test_sim_cli import MATRIX


def test_report_from_results(tmp_path, capsys):
    m = tmp_path / "m.yaml"
    m.write_text(MATRIX)
    res = tmp_path / "r.json"
    assert main(["bench", "--matrix", str(m), "--json", str(res), "--no-progress"]) == 0
    val = tmp_path / "v.json"
    val.write_text(json.dumps({"note": "n", "rows": [
        {"world": 2, "strategy": "zeppelin", "measured_s": 0.2, "predicted_s": 0.22}]}))
    out, figs = tmp_path / "results.md", tmp_path / "figs"
    assert main(["report", "--results", str(res), "--validation", str(val), "--out", str(out),
                 "--figures", str(figs)]) == 0
    text = out.read_text()
    assert "zeppelin bench --matrix" in text and "zeppelin report" in text
    assert "| static_cp |" in text and "Where Zeppelin loses" in text
    assert "## Study `ablation`" in text and "+10.0%" in text
    assert (figs / "speedup_main.png").stat().st_size > 0
    # a user's own matrix: no paper timelines or regime notes added to it
    assert not (figs / "gantt_zeppelin.png").exists() and "Timeline" not in text and "Two batch regimes" not in text
    assert "oracle" in text and "deployed" in text
    assert "figs/speedup_main.png" in text
    assert "CPU error" not in text  # rows without CPU times: the old table
    val.write_text(json.dumps({"note": "n", "rows": [
        {"world": 2, "strategy": "zeppelin", "measured_s": 0.2, "predicted_s": 0.22,
         "measured_cpu_s": 0.4, "simulated_cpu_s": 0.38}]}))
    assert main(["report", "--results", str(res), "--validation", str(val), "--out", str(out),
                 "--figures", str(figs)]) == 0
    assert "| 2 | zeppelin | 200.0 | 220.0 | +10.0% | 400.0 | 380.0 | -5.0% |" in out.read_text()
    assert "calibration speed" not in out.read_text()
    val.write_text(json.dumps({"note": "n", "rows": [  # the host 10% slower during the repeats
        {"world": 2, "strategy": "zeppelin", "measured_s": 0.2, "predicted_s": 0.22,
         "measured_cpu_s": 0.4, "simulated_cpu_s": 0.38, "error_at_calibration": 0.22 / 0.18 - 1}]}))
    assert main(["report", "--results", str(res), "--validation", str(val), "--out", str(out),
                 "--figures", str(figs)]) == 0
    assert "| 2 | zeppelin | 200.0 | 220.0 | +10.0% | 400.0 | 380.0 | -5.0% | +22.2% |" in out.read_text()


def test_report_rejects_missing_results(tmp_path, capsys):
    assert main(["report", "--results", str(tmp_path / "nope.json"), "--out", str(tmp_path / "r.md")]) == 2
    assert "cannot read --results" in capsys.readouterr().err


def test_speedup_bars_stack_wide_studies(tmp_path):
    """A study of more configurations than BARS_PER_ROW is drawn as stacked panels, not one ever
    wider figure."""
    import matplotlib.image as mpimg

    from megatron_zeppelin.plots.matrix import BARS_PER_ROW, speedup_bars

    def recs(n):
        return [{"study": "s", "key": f"k{i:03d}", "label": f"config {i}", "variant": v, "iteration_s": t}
                for i in range(n) for v, t in (("zeppelin", 1.0), ("static_cp", 1.2), ("hybrid_dp", 1.1))]
    shapes = {}
    for n in (BARS_PER_ROW, 2 * BARS_PER_ROW + 1):
        path = str(tmp_path / f"bars{n}.png")
        speedup_bars(recs(n), path, study="s")
        shapes[n] = mpimg.imread(path).shape
    one, three = shapes[BARS_PER_ROW], shapes[2 * BARS_PER_ROW + 1]
    assert three[0] > 2.5 * one[0] and three[1] < 1.2 * one[1]  # three panels high, as wide as one


def test_speedup_bars_keep_zeppelins_variants_apart(tmp_path):
    """Zeppelin's own variants (joint assignment, the partitioner alone) are drawn in a panel of their
    own below the baselines', never as bars beside them: the same study with them is two panels high."""
    import matplotlib.image as mpimg

    from megatron_zeppelin.plots.matrix import speedup_bars

    def recs(variants):
        return [{"study": "s", "key": f"k{i}", "label": f"config {i}", "variant": v, "iteration_s": t}
                for i in range(4) for v, t in (("zeppelin", 1.0), *variants)]
    base = (("static_cp", 1.2), ("hybrid_dp", 1.1))
    heights = {}
    for name, variants in (("bases", base), ("both", base + (("zeppelin+joint", 0.9), ("zeppelin-partitioner", 1.3))),
                           ("only_variants", (("zeppelin+joint", 0.9),))):
        path = str(tmp_path / f"{name}.png")
        speedup_bars(recs(variants), path, study="s")
        heights[name] = mpimg.imread(path).shape[0]
    assert heights["both"] > 1.8 * heights["bases"]
    assert heights["only_variants"] < 1.2 * heights["bases"]


def test_a_study_shows_its_own_figures_only():
    """"speedup bars: memory" belongs to the study `memory`, not to `ablation_memory` or
    `balance_memory`, whose names end the same."""
    from megatron_zeppelin.reports.matrix import render
    studies = ("memory", "ablation_memory", "balance_memory")
    empty = {"summary": {}, "balance": {}}
    doc = {"runs": [], "studies": {s: empty for s in studies}, "summary": {}, "balance": {}}
    figures = {f"speedup bars: {s}": f"figures/speedup_{s}.png" for s in studies}
    text = render(doc, [], figures)
    for s in studies:
        section = text.split(f"## Study `{s}`")[1].split("## Study")[0]
        assert section.count("![speedup bars") == 1 and f"(figures/speedup_{s}.png)" in section


def test_gpu_terms_table_has_a_row_per_term():
    """A study run with GPU cost terms off (sim/gpu_terms.py) gets one row per term, in the module's
    order, with Zeppelin's speedup over each baseline under that profile."""
    from megatron_zeppelin.reports.matrix import _gpu_terms

    def rec(term, v, t):
        key = f"g/a800/x{'' if term == 'nothing' else '/no-' + term}"
        return {"study": "g", "key": key, "variant": v, "iteration_s": t, "lower_bound_s": 1.0, "error": "",
                "oracle_iteration_s": t, "gpu_term_off": term}
    runs = [rec(term, v, t * k) for k, term in ((1.0, "nothing"), (1.1, "full"), (1.0, "every"))
            for v, t in (("zeppelin", 2.0), ("static_cp", 3.0))]
    runs[-1]["iteration_s"] = 4.0  # static_cp with every term off: 2.0x
    text = "\n".join(_gpu_terms(runs, "g"))
    rows = [l for l in text.splitlines() if l.startswith("| ") and "profile" not in l]
    assert [r.split(" | ")[0] for r in rows] == ["| every term on (the preset)", "| full off", "| every term off"]
    assert rows[0].split(" | ")[1:3] == ["1.50x", "1.50x"] and rows[2].split(" | ")[1] == "2.00x"
    assert _gpu_terms([r for r in runs if r["gpu_term_off"] == "nothing"], "g") == []
