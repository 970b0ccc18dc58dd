"""docs/results.md leads with issue 49's headline: Zeppelin against the best deployed baseline per
configuration at 1M-4M-token global batches with gradient accumulation; runs of several micro-batches
are their own regime; Zeppelin's own variants are never baselines; pipeline and joint sections."""

import json
import os
import shutil

from megatron_zeppelin.cli import main
from megatron_zeppelin.commands.report import _doc
from megatron_zeppelin.reports.matrix import render

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ABLATION_NAMES = ("zeppelin+joint", "zeppelin-partitioner", "zeppelin-noulysses", "zeppelin-noremap",
                  "static_cp+routing")


def _runs(key, times, *, model="llama-7b", ds="prolong64k", gbs=1 << 20, mb=4, pp=1, regime="memory", lb=1.05,
          study="accumulation"):
    """A configuration's records: ``times`` {variant: mean iteration}; Zeppelin's lower bound so that
    Zeppelin / lower bound = ``lb``."""
    return [{"key": key, "label": key, "study": study, "variant": v, "iteration_s": t, "error": "",
             "oracle_iteration_s": t, "lower_bound_s": times["zeppelin"] / lb, "time_imbalance": 1.0,
             "memory_imbalance": 1.0, "model": model, "tp": 1, "dataset": ds, "context": 65536, "ranks": 16 // pp,
             "micro_batches": mb, "global_batch_tokens": gbs, "pipeline": pp, "regime": regime}
            for v, t in times.items()]


def _records():
    return (
        # MHA prolong64k: static_cp the best baseline (1.5x); static_cp+routing and zeppelin+joint are faster
        # but Zeppelin's own variants, never the baseline
        _runs("A", {"zeppelin": 1.0, "static_cp": 1.5, "packed_dp": 2.0, "zeppelin+joint": 0.9,
                    "static_cp+routing": 0.5}, lb=1.05)
        + _runs("B", {"zeppelin": 2.0, "hybrid_dp": 2.2, "dynamic_cp": 2.6}, ds="arxiv", gbs=4 << 20, mb=16, lb=1.10)
        # GQA github: Zeppelin loses to dynamic_cp
        + _runs("C", {"zeppelin": 1.0, "dynamic_cp": 0.95}, model="llama3-8b", ds="github", lb=1.02)
        + _runs("D", {"zeppelin": 1.0, "static_cp": 1.3, "zeppelin-partitioner": 0.8}, model="llama3-8b",
                gbs=4 << 20, lb=1.03)
        # not the headline's: one micro-batch, an 8M-token global batch, pipeline stages, a wrong profile
        + _runs("E", {"zeppelin": 1.0, "static_cp": 3.0}, ds="arxiv", gbs=0, mb=1, lb=1.5, study="memory")
        + _runs("F", {"zeppelin": 1.0, "static_cp": 5.0}, gbs=8 << 20, mb=32, lb=1.6)
        + _runs("G", {"zeppelin": 1.0, "static_cp": 4.0, "zeppelin+joint": 0.8}, mb=8, pp=2, lb=1.7,
                study="pipeline")
        + _runs("H", {"zeppelin": 1.0, "static_cp": 2.5}, mb=4, pp=4, lb=1.7, study="pipeline"))


def _sections(text):
    return [line for line in text.splitlines() if line.startswith("## ")]


def _section(text, title):
    return text.split(title, 1)[1].split("\n## ", 1)[0]


def _baseline_rows(text):
    """Every row of every "| baseline |" table of the report."""
    rows, inside = [], False
    for line in text.splitlines():
        if line.startswith("| baseline |"):
            inside = True
        elif inside and line.startswith("|"):
            rows.append(line)
        else:
            inside = False
    return rows


def test_headline_leads_with_the_hand_checked_numbers():
    text = render(_doc("m.yaml", _records()), ["zeppelin bench"], {})
    assert _sections(text)[0].startswith("## Headline: Zeppelin against the best deployed baseline, 1M-4M-token")
    head = _section(text, "## Headline")
    # MHA: A 1.5 (static_cp), B 2.2 / 2.0 = 1.1 (hybrid_dp); GQA: C 0.95 (dynamic_cp), D 1.3 (static_cp)
    assert "| MHA models | 1.30x | 1.28x | 1.10x | 1.50x | 2 | 0 |" in head        # geomean sqrt(1.65) = 1.2845
    assert "| GQA models | 1.12x | 1.11x | 0.95x | 1.30x | 2 | 1 |" in head        # mean 1.125, geomean 1.1113
    assert "| all | 1.21x | 1.19x | 0.95x | 1.50x | 4 | 1 |" in head               # 4.85 / 4, (1.853)^(1/4)
    assert "| all, Zeppelin with joint assignment (`zeppelin+joint`) | 1.67x |" in head   # A: 1.5 / 0.9
    # per long-context mix beside the aim (stated, never asserted in the project: here a rendering check)
    assert "| prolong64k | 1.50x | 1.30x | 1.40x | 1.40x | 1.30x | 1.50x | 2 | meets it (1.40x measured) |" in head
    assert "| arxiv | 1.10x | - | 1.10x |" in head and "below it (1.10x measured)" in head
    assert "| github | - | 0.95x | 0.95x |" in head
    assert "| the three together | 1.30x | 1.12x | 1.21x |" in head
    # Zeppelin / lower bound over A-D only: mean (1.05 + 1.10 + 1.02 + 1.03) / 4, max 1.10
    assert "mean 1.050 (goal <= 1.08), max 1.100 (goal <= 1.25)" in head
    assert ("Zeppelin slower than the best deployed baseline in 1 configuration: C (dynamic_cp faster, "
            "speedup 0.950x)") in head
    assert "dynamic_cp in 1, hybrid_dp in 1, static_cp in 2" in head
    assert "4 configurations" in head and "1M, 4M-token global batch" in head


def test_several_micro_batches_are_their_own_regime():
    doc = _doc("m.yaml", _records())
    regimes = {t.split(" (")[0]: s for t, s in doc["regimes"].items()}
    best = {t: s["summary"]["best_baseline"]["deployed"] for t, s in regimes.items()}
    assert best["global batches with gradient accumulation"]["configs"] == 5          # A-D and the 8M F
    assert best["pipeline stages"]["configs"] == 2                                     # G, H
    assert best["memory-bound batches"]["configs"] == 1                                # E alone
    assert best["memory-bound batches"]["mean_speedup"] == 3.0
    assert "a set number of tokens per GPU" not in regimes
    text = render(doc, [], {})
    order = _sections(text)
    assert order[1] == "## How these results were made"
    assert order[2].startswith("## Summary: global batches with gradient accumulation")
    assert order[3].startswith("## Summary: pipeline stages")
    assert order[4].startswith("## Summary: memory-bound batches")


def test_zeppelins_variants_are_never_baselines():
    text = render(_doc("m.yaml", _records()), [], {})
    rows = _baseline_rows(text)
    assert rows and not [r for r in rows if r.split("|")[1].strip() in ABLATION_NAMES]
    # they have their own table, Zeppelin's speedup over each
    assert "| static_cp+routing | 0.50x |" in text and "| zeppelin+joint |" in text
    # the per-configuration column: A's best deployed baseline is static_cp (1.50x), not the routed 0.50x
    study = _section(text, "## Study `accumulation`")
    row = next(line for line in study.splitlines() if line.startswith("| A "))
    assert row.split(" | ")[-3] == "1.50x"


def test_pipeline_section_and_the_joint_line():
    text = render(_doc("m.yaml", _records()), [], {})
    study = _section(text, "## Study `pipeline`")
    assert "| 2 | 8 | 1 | 4.00x / 5.00x | 4.00x / 5.00x (min 4.00x, max 4.00x) | 1.250x |" in study
    assert "| 4 | 4 | 1 | 2.50x | 2.50x (min 2.50x, max 2.50x) | - |" in study
    assert "mean 1.250x, min 1.250x, max 1.250x" in study            # G: 1.0 / 0.8
    acc = _section(text, "## Study `accumulation`")
    assert "(joint assignment): speedup over the default, rounds" in acc and "mean 1.111x" in acc   # A: 1.0 / 0.9
    assert "By pipeline size" not in acc


def test_no_accumulation_runs_says_so():
    recs = _runs("E", {"zeppelin": 1.0, "static_cp": 3.0}, gbs=0, mb=1, study="memory")
    text = render(_doc("m.yaml", recs), [], {})
    assert _sections(text)[0].startswith("## Headline")
    assert "No run in this report is a 1M-4M-token global batch" in _section(text, "## Headline")


def test_report_from_the_joint_study_files(tmp_path):
    """`zeppelin report` from the joint studies' recorded files (results/joint/): the headline first,
    holding the one configuration with baselines (PP 1: dynamic_cp 15.821 s vs Zeppelin 15.819 s)."""
    src = os.path.join(ROOT, "results", "joint")
    files = []
    for f in ("accumulation.json", "pipeline.json"):
        shutil.copy(os.path.join(src, f), tmp_path / f)
        files.append(str(tmp_path / f))
    out = tmp_path / "r.md"
    assert main(["report", "--results", *files, "--out", str(out), "--figures", str(tmp_path / "figs")]) == 0
    text = out.read_text()
    assert _sections(text)[0].startswith("## Headline")
    head = _section(text, "## Headline")
    runs = [r for f in files for r in json.load(open(f))["runs"]]
    pp1 = {r["variant"]: r["iteration_s"] for r in runs
           if r["study"] == "joint_pipeline" and r["pipeline"] == 1 and r.get("iteration_s")}  # packed_dp: OOM
    best = min(t for v, t in pp1.items() if v not in ("zeppelin", "zeppelin+joint"))
    assert f"| GQA models | {best / pp1['zeppelin']:.2f}x |" in head
    assert "No baseline completed (none ran, or none fits) in 6 of them" in head       # accumulation: Zeppelin only
    assert "7 configurations" in head
    pipe = _section(text, "## Study `joint_pipeline`")
    table = pipe.split("| PP |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    assert [row.split(" | ")[:2] for row in table] == [["| 1", "16"], ["| 2", "8"], ["| 4", "4"], ["| 8", "2"]]
