"""Issue 53: which candidate won each plan, the partitioner alone, a wrong profile, one regenerate command."""

import io
import json

from megatron_zeppelin.cli import main

MATRIX = """
seed: 1
batches: 2
cp_sizes: [1, 2, 4]
strategies: [zeppelin, packed_dp, static_cp, zeppelin-partitioner]
studies:
  main:
    clusters: [a800]
    models: [tiny]
    datasets: [github]
    context: [4K]
    nodes: [1, 2]
  robustness:
    clusters: [a800]
    models: [tiny]
    datasets: [github]
    context: [4K]
    nodes: [2]
    profile_error: 0.25
    profile_seeds: [0, 1, 2]
"""


def _matrix(tmp_path):
    m = tmp_path / "m.yaml"
    m.write_text(MATRIX)
    return str(m)


def test_the_partitioner_alone_never_takes_a_portfolio_shape():
    """zeppelin-partitioner plans with the partitioner's candidates only; Zeppelin's full search may
    take a shape, and is never predicted slower than the partitioner alone."""
    from megatron_zeppelin.planner.testing import toy_context
    from megatron_zeppelin.sim.attribution import PARTITIONER, candidate_kind
    from megatron_zeppelin.sim.runs import make_plan
    ctx = toy_context(nodes=1, gpus=4)
    lengths = [8000, 5000, 300, 200, 100, 90]  # partition.py's worked example: a static_cp shape wins it
    full = make_plan("zeppelin", lengths, ctx.topology, ctx.profile, ctx.model, ctx.config)
    alone = make_plan("zeppelin-partitioner", lengths, ctx.topology, ctx.profile, ctx.model, ctx.config)
    assert candidate_kind(full.meta.variant).startswith("static_cp")
    assert candidate_kind(alone.meta.variant).startswith(PARTITIONER) and "shape" not in alone.meta.variant
    assert full.predicted_iteration_s <= alone.predicted_iteration_s


def test_a_perturbed_profile_changes_the_plans_not_the_simulators_profile(tmp_path):
    """The robustness study: seed 0 is the true profile; other seeds plan with their own factors (in
    the record), simulated with the true profile (the same batches: a plan that did not change has
    the same simulated time)."""
    from megatron_zeppelin.sim.matrix import load_matrix, run_matrix, Progress
    from megatron_zeppelin.sim.perturb import factors
    items, _ = load_matrix(_matrix(tmp_path))
    rob = [it for it in items if it[0].study == "robustness"]
    assert [(it[0].profile_error, it[0].profile_seed) for it in rob] == [(0.0, 0), (0.25, 1), (0.25, 2)]
    assert len({it[0].key() for it in rob}) == 3
    recs = run_matrix(rob, progress=Progress.NONE)
    for r in recs:
        if r["profile_error"]:
            assert r["profile_factors"] == factors(0.25, r["profile_seed"])
        else:
            assert "profile_factors" not in r
    # packed_dp has one plan per batch whatever the profile: its simulated time cannot move
    packed = {r["profile_seed"]: r["iteration_s"] for r in recs if r["variant"] == "packed_dp" and not r["error"]}
    assert len(set(packed.values())) <= 1


def test_jobs_give_the_same_records_and_out_dir_writes_each_study_and_the_report(tmp_path, capsys):
    """--jobs 2 changes no number; --out-dir writes a JSON per study, --report the page with the
    attribution table and the robustness section; progress lines have done/total, elapsed and eta."""
    from megatron_zeppelin.sim.matrix import Progress, load_matrix, run_matrix
    items, _ = load_matrix(_matrix(tmp_path))
    log = io.StringIO()
    one = run_matrix(items, progress=Progress.NONE)
    two = run_matrix(items, progress=Progress.LINES, stream=log, jobs=2)
    clock = ("plan_s", "sim_s")
    assert [{k: v for k, v in r.items() if k not in clock} for r in one] == \
        [{k: v for k, v in r.items() if k not in clock} for r in two]
    lines = log.getvalue().splitlines()
    assert len(lines) == len(items) and lines[-1].startswith(f"[{len(items)}/{len(items)}] ")
    assert all(", eta " in x and "elapsed" in x for x in lines)

    out = tmp_path / "results"
    rc = main(["bench", "--matrix", _matrix(tmp_path), "--studies", "all", "--jobs", "2", "--out-dir", str(out),
               "--report", str(out / "results.md"), "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "total " in text.splitlines()[-1]
    main_doc = json.loads((out / "main.json").read_text())
    assert main_doc["command"].startswith("zeppelin bench") and "--studies main" in main_doc["command"]
    assert {r["study"] for r in main_doc["runs"]} == {"main"} and (out / "robustness.csv").exists()
    z = [r for r in main_doc["runs"] if r["variant"] == "zeppelin"]
    assert all(sum(r["won"].values()) == r["batches"] and len(r["batch_variants"]) == r["batches"] for r in z)
    att = main_doc["studies"]["main"]["attribution"]
    assert att["plans"] == sum(r["batches"] for r in z)
    page = (out / "results.md").read_text()
    assert "## Attribution" in page and "Zeppelin / partitioner alone" in page
    assert "Every strategy planned with a profile off by up to +-25%" in page
    assert "zeppelin-partitioner" not in main_doc["summary"].get("best_baseline", {}).get("best_of", {})


def test_a_loss_under_a_wrong_profile_is_replanned_term_by_term(tmp_path):
    """Where Zeppelin planned with a wrong profile loses to the best deployed baseline, its run is
    replanned with each term's factor alone and with each left true (sim/loss_terms.py); naming every
    term is the run itself; a run Zeppelin does not lose, or a true profile, is left as it is."""
    import dataclasses
    from megatron_zeppelin.sim.loss_terms import with_loss_terms
    from megatron_zeppelin.sim.matrix import load_matrix
    from megatron_zeppelin.sim.perturb import TERMS
    from megatron_zeppelin.sim.runs import run_config
    items, _ = load_matrix(_matrix(tmp_path))
    true, wrong = [it[0] for it in items if it[0].study == "robustness"][:2]
    every = dataclasses.replace(wrong, profile_terms="+".join(TERMS))
    assert every.key() != wrong.key() and every.label().endswith(":" + "+".join(TERMS))
    z = run_config(wrong, ["zeppelin"])[0]
    assert run_config(every, ["zeppelin"])[0]["iteration_s"] == z["iteration_s"]

    def faster(rec, by):  # a baseline's record beside Zeppelin's, ``by`` times its time
        return {**rec, "variant": "hybrid_dp", "iteration_s": rec["iteration_s"] * by}
    assert "loss_terms" not in with_loss_terms(wrong, [dict(z), faster(z, 1.5)])[0]  # Zeppelin wins
    zt = run_config(true, ["zeppelin"])[0]
    assert "loss_terms" not in with_loss_terms(true, [zt, faster(zt, 0.5)])[0]  # the true profile
    lost = with_loss_terms(wrong, [dict(z), faster(z, 0.5)])[0]["loss_terms"]
    assert lost["baseline"] == "hybrid_dp" and lost["baseline_s"] == z["iteration_s"] * 0.5
    assert set(lost["alone"]) == set(lost["left_out"]) == set(TERMS)
    assert all(t > 0 for t in list(lost["alone"].values()) + list(lost["left_out"].values()))
