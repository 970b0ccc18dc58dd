"""`zeppelin simulate` and `zeppelin bench` end to end on small configurations."""

import json

from megatron_zeppelin.cli import main

MATRIX = """
seed: 1
batches: 2
cp_sizes: [1, 2, 4]
strategies: [zeppelin, packed_dp, static_cp]
studies:
  main:
    clusters: [a800]
    models: [tiny, {name: tiny, tp: 2}]
    datasets: [github]
    context: [4K]
    nodes: [1, 2]
  ablation:
    clusters: [a800]
    models: [tiny]
    datasets: [github]
    context: [4K]
    nodes: [2]
    strategies: [static_cp, static_cp+routing, zeppelin-noremap, zeppelin]
"""


def test_bench_writes_runs_summary_csv_and_plots(tmp_path, capsys):
    m = tmp_path / "m.yaml"
    m.write_text(MATRIX)
    out, csv = tmp_path / "r.json", tmp_path / "r.csv"
    rc = main(["bench", "--matrix", str(m), "--json", str(out), "--csv", str(csv), "--plots", str(tmp_path / "p"),
               "--no-progress"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc["summary"]) == {"packed_dp", "static_cp", "best_baseline", "zeppelin_lower_bound"}
    # the best deployed baseline per configuration: Zeppelin's least speedup over either, per run
    by_key = {}
    for r in doc["runs"]:
        if r["study"] == "main":
            by_key.setdefault(r["key"], {})[r["variant"]] = r["iteration_s"]
    want = [min(v["packed_dp"], v["static_cp"]) / v["zeppelin"] for v in by_key.values()]
    best = doc["summary"]["best_baseline"]
    assert best["deployed"]["mean_speedup"] == sum(want) / len(want) and best["deployed"]["configs"] == 4
    assert sum(best["best_of"].values()) == 4
    for b in ("packed_dp", "static_cp"):
        for col in ("deployed", "oracle"):
            s = doc["summary"][b][col]
            assert s["max_speedup"] >= s["mean_speedup"] >= s["min_speedup"] > 0
            assert s["configs"] == 4
    assert len(doc["runs"]) == 4 * 3 + 4
    assert all(r["error"] == "" and r["iteration_s"] > 0 and len(r["batch_iteration_s"]) == 2 for r in doc["runs"])
    static = [r for r in doc["runs"] if r["variant"] == "static_cp"]
    # one CP size for the whole run: the fitting one of least mean; the oracle re-picks per batch
    assert all(r["iteration_s"] == min(x for x in r["tried"].values() if x is not None) for r in static)
    assert all(r["oracle_iteration_s"] <= r["iteration_s"] * (1 + 1e-12) for r in static)
    assert all(r["run_setting"] == r["cp_size"] and len(r["oracle_settings"]) == 2 for r in static)
    lb = doc["summary"]["zeppelin_lower_bound"]
    assert lb["max"] >= lb["mean"] >= 1.0
    assert all(0 < r["memory_imbalance"] and r["time_imbalance"] >= 1.0 for r in doc["runs"])
    assert "ablation" in doc["studies"] and "zeppelin-noremap" in doc["studies"]["ablation"]["summary"]
    assert csv.read_text().count("\n") == len(doc["runs"]) + 1
    assert (tmp_path / "p" / "speedup_main.png").stat().st_size > 0
    assert "Zeppelin / lower bound" in capsys.readouterr().out


def test_bench_rejects_unknown_strategy(tmp_path, capsys):
    m = tmp_path / "m.yaml"
    m.write_text(MATRIX.replace("packed_dp, static_cp]", "packed_dp, bogus]"))
    assert main(["bench", "--matrix", str(m), "--no-progress"]) == 2
    assert "bogus" in capsys.readouterr().err


def test_simulate_prints_and_writes_gantt_and_json(tmp_path, capsys):
    g, j = tmp_path / "g.png", tmp_path / "s.json"
    rc = main(["simulate", "--dataset", "github", "--cluster", "a800", "--model", "tiny", "--nodes", "2",
               "--global-batch-tokens", "64K", "--context-length", "8K", "--strategy", "zeppelin",
               "--gantt", str(g), "--json", str(j)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "simulated iteration" in text and "NIC utilisation" in text
    doc = json.loads(j.read_text())
    assert doc["iteration_s"] > 0 and len(doc["nic"]) == 8 and doc["timeline"]
    assert g.stat().st_size > 0


def test_simulate_with_the_batch_and_capacity_memory_allows(capsys):
    rc = main(["simulate", "--cluster", "a800", "--model", "llama-7b", "--nodes", "2", "--dataset", "prolong64k",
               "--global-batch-tokens", "memory", "--capacity-tokens", "memory", "--strategy", "static_cp"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "tokens fit one rank" in out and "CP size 16 (" in out  # a 64K document: CP over both nodes
    assert "{'" not in out and "cp_size" not in out  # no raw dicts or internal names
    rc = main(["simulate", "--cluster", "a800", "--model", "llama-7b", "--nodes", "2", "--dataset", "prolong64k",
               "--global-batch-tokens", "memory", "--capacity-tokens", "memory", "--strategy", "packed_dp"])
    assert rc == 2 and "runs out of memory" in capsys.readouterr().err


def test_simulate_compare_and_seeds_in_words(tmp_path, capsys):
    j = tmp_path / "s.json"
    rc = main(["simulate", "--dataset", "github", "--cluster", "a800", "--model", "tiny", "--nodes", "2",
               "--global-batch-tokens", "32K", "--seq-length", "4K", "--strategy", "static_cp", "--compare",
               "--seeds", "2", "--json", str(j)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "every strategy on the same batch (simulated)" in out and "over 2 sampled batches (seeds 0..1)" in out
    assert "{" not in out and "cp_size" not in out and "static_cp" not in out  # no dicts, no internal names
    assert "static CP: documents" in out and "CP size " in out
    doc = json.loads(j.read_text())
    assert set(doc["compare"]) >= {"zeppelin", "packed_dp", "static_cp"}
    z = doc["compare"]["zeppelin"]
    assert z["zeppelin_speedup"] == 1.0 and z["iteration_s"] > 0
    assert doc["seeds"]["strategies"]["static_cp"]["iteration_s"]["n"] == 2


def test_simulate_bad_flags_are_one_line(tmp_path, capsys):
    for argv, needle in ((["--nodes", "0"], "--nodes must be >= 1"), (["--tp", "3"], "--tp 3 does not divide"),
                         (["--seeds", "0"], "--seeds must be >= 1")):
        j = tmp_path / "s.json"
        assert main(["simulate", "--model", "llama-7b", "--global-batch-tokens", "64K", "--json", str(j), *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("zeppelin simulate: error:") and needle in err[0], err
        assert not j.exists()


def test_bench_shards_split_the_configurations_and_the_report_merges_them(tmp_path, capsys):
    m = tmp_path / "m.yaml"
    m.write_text(MATRIX)
    whole = tmp_path / "whole.json"
    assert main(["bench", "--matrix", str(m), "--studies", "main", "--json", str(whole), "--no-progress"]) == 0
    parts = [tmp_path / f"s{k}.json" for k in (1, 2, 3)]
    for k, p in enumerate(parts, 1):
        assert main(["bench", "--matrix", str(m), "--studies", "main", "--shard", f"{k}/3", "--json", str(p),
                     "--no-progress"]) == 0
        assert f"--shard {k}/3" in json.loads(p.read_text())["command"]
    keys = [sorted({r["key"] for r in json.loads(p.read_text())["runs"]}) for p in parts]
    assert [len(k) for k in keys] == [2, 1, 1]  # 4 configurations: every 3rd from the 1st, 2nd, 3rd
    runs = {(r["key"], r["variant"]): r["iteration_s"] for p in parts for r in json.loads(p.read_text())["runs"]}
    assert runs == {(r["key"], r["variant"]): r["iteration_s"] for r in json.loads(whole.read_text())["runs"]}
    report = tmp_path / "results.md"
    assert main(["report", "--results", *map(str, parts), "--out", str(report), "--figures",
                 str(tmp_path / "fig"), "--no-progress"]) == 0
    assert "--shard 3/3" in report.read_text()
    assert main(["bench", "--matrix", str(m), "--studies", "main", "--shard", "5/5", "--no-progress"]) == 2
    assert "selects none of the 4 configuration(s)" in capsys.readouterr().err
    assert main(["bench", "--matrix", str(m), "--shard", "0/2", "--no-progress"]) == 2
    assert "--shard 0/2: want K/N" in capsys.readouterr().err


def test_bench_reports_each_configuration_when_not_on_a_terminal(tmp_path):
    """Off a terminal (nohup, a background job, SLURM) progress is a line per finished configuration;
    --no-progress prints none."""
    import io

    from megatron_zeppelin.sim.matrix import Progress, load_matrix, run_matrix
    m = tmp_path / "m.yaml"
    m.write_text(MATRIX.replace("nodes: [1, 2]", "nodes: [1]").split("  ablation:")[0])
    items, _ = load_matrix(str(m))
    log = io.StringIO()
    run_matrix(items, progress=Progress.LINES, stream=log)
    lines = log.getvalue().splitlines()
    assert len(lines) == len(items) == 2
    assert lines[-1].startswith(f"[{len(items)}/{len(items)}] ") and " done in " in lines[-1]
    quiet = io.StringIO()
    run_matrix(items, progress=Progress.NONE, stream=quiet)
    assert quiet.getvalue() == ""

    class Tty(io.StringIO):
        def isatty(self):
            return True
    assert Progress.for_stream(False, Tty()) is Progress.BAR
    assert Progress.for_stream(False, io.StringIO()) is Progress.LINES
    assert Progress.for_stream(True, Tty()) is Progress.NONE


ACCUMULATION = """
seed: 0
cp_sizes: [1, 2, 4]
strategies: [zeppelin, packed_dp, static_cp]
studies:
  accumulation:
    clusters: [a800]
    models: [tiny]
    datasets: [github]
    context: [4K]
    nodes: [1]
    tokens_per_gpu: 1K
    global_batch_tokens: [16K, 32K]
    recompute: per_strategy
    batches: 3
"""


def test_bench_runs_global_batches_of_micro_batches_with_recompute_per_strategy(tmp_path, capsys):
    m = tmp_path / "m.yaml"
    m.write_text(ACCUMULATION)
    out, csv = tmp_path / "r.json", tmp_path / "r.csv"
    assert main(["bench", "--matrix", str(m), "--batches", "1", "--json", str(out), "--csv", str(csv),
                 "--no-progress"]) == 0
    doc = json.loads(out.read_text())
    assert "--batches 1" in doc["command"]
    runs = doc["runs"]
    assert len(runs) == 2 * 3 and all(r["error"] == "" and r["batches"] == 1 for r in runs)
    assert sorted({(r["global_batch_tokens"], r["micro_batches"]) for r in runs}) == [(16384, 2), (32768, 4)]
    assert all(r["recompute_per_strategy"] and "gbs" in r["key"] and " rc=" in next(iter(r["tried"])) for r in runs)
    assert all(r["tokens"] == r["micro_batches"] * 8 * 1024 for r in runs)  # every micro-batch, 8 ranks x 1K
    header = csv.read_text().splitlines()[0].split(",")
    assert "micro_batches" in header and "global_batch_tokens" in header
    assert "best_baseline" in doc["summary"]
