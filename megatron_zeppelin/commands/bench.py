"""``zeppelin bench``: the paper's experiment matrix on the simulator (results JSON/CSV, summary, plots)."""

from __future__ import annotations

import csv
import json
import os
import statistics
import sys
import time

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.words import DocClass

CSV_FIELDS = ("study", "regime", "cluster", "model", "tp", "dataset", "context", "nodes", "ranks", "tokens_per_gpu",
              "global_batch_tokens", "micro_batches", "capacity", "recompute", "batches", "variant", "run_setting_name", "run_setting", "cp_size", "documents",
              "tokens", "max_length", "iteration_s", "oracle_iteration_s", "predicted_s", "lower_bound_s",
              "recompute_s", "allreduce_s", "forward_s", "backward_s", "time_imbalance", "memory_imbalance",
              "memory_imbalance_attention", "memory_imbalance_linear", "peak_activation_GB", "max_nic_util",
              "nic_bytes", "nvlink_bytes", "plan_s", "sim_s", "error", "oracle_error")


def add_parser(subparsers):
    p = subparsers.add_parser(
        "bench", help="run the paper's benchmark matrix on the simulator",
        description="Expand a run matrix (clusters x models x datasets x context lengths x nodes) into runs of "
                    "N batches, plan every batch with every strategy (each baseline's run-level settings fixed "
                    "for the run, as deployed; and tuned per batch, with hindsight), simulate each plan, and "
                    "summarise Zeppelin's speedup over each baseline.")
    p.add_argument("--matrix", default=None,
                   help="run matrix YAML (default: the project's megatron_zeppelin/presets/runs/paper.yaml, found from any directory)")
    p.add_argument("--studies", default="", help="comma-separated studies of the matrix to run, or `all` (default: all)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="simulate N configurations at a time in worker processes (the same numbers as one at a time)")
    p.add_argument("--out-dir", metavar="DIR",
                   help="write each study's runs to DIR/<study>.json and .csv (instead of --json/--csv), then, with "
                        "--report, the report from them: `zeppelin bench --studies all --out-dir results/bench "
                        "--report docs/results.md` regenerates docs/results.md")
    p.add_argument("--report", metavar="FILE", help="with --out-dir: write the report (`zeppelin report`) here")
    p.add_argument("--figures", metavar="DIR", default=None,
                   help="with --report: its figure folder (default: figures/ beside the report)")
    p.add_argument("--validation", metavar="FILE",
                   help="with --report: the CPU validation JSON to include (`zeppelin bench --validate-cpu --json`)")
    p.add_argument("--previous", metavar="FILE",
                   help="with --report: the previous report's results.json to quote beside the new summary "
                        "(default: the --figures folder's)")
    p.add_argument("--shard", metavar="K/N", default="",
                   help="run only the K-th of N shares of the configurations (every N-th, from the K-th; "
                        "1 <= K <= N), to split a long study over processes or jobs: `zeppelin report "
                        "--results` merges the shards' --json files")
    p.add_argument("--batches", type=int, default=0, metavar="N",
                   help="runs of N batches in every study (default: each study's own), for a quick slice")
    p.add_argument("--json", metavar="FILE", help="write every run and the summary as JSON")
    p.add_argument("--csv", metavar="FILE", help="write every run as CSV")
    p.add_argument("--plots", metavar="DIR", help="write speedup bars and scaling lines (PNG) here")
    p.add_argument("--overlap-grad-reduce", action="store_true", help="overlap the DP all-reduce with the backward")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress (default: a bar on a terminal, else a line per finished configuration)")
    g = p.add_argument_group("validation on this CPU (instead of the matrix)")
    g.add_argument("--validate-cpu", action="store_true",
                   help="calibrate this CPU (gloo) and compare the simulator with measured engine runs of every "
                        "strategy; --json writes the table for `zeppelin report --validation` (about 4.5 minutes "
                        "for worlds 2 and 4 on a 2-core machine: three calibrations per world)")
    g.add_argument("--world", type=int, action="append", default=None,
                   help="ranks for --validate-cpu (repeatable; default 2 and 4)")
    g.add_argument("--repeat", type=int, default=7, help="timed repeats for --validate-cpu (median kept)")
    g.add_argument("--profiles", default="out/calibrate", help="where --validate-cpu writes cpu-w<N>.yaml")
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    p.set_defaults(func=run)
    return p


def command_line(args) -> str:
    """The command that reproduces this run (from the parsed flags, not sys.argv)."""
    parts = ["zeppelin bench"] + ([f"--matrix {args.matrix}"] if args.matrix else [])
    for flag in ("studies", "shard", "batches", "json", "csv", "plots"):  # --jobs changes no number
        if getattr(args, flag):
            parts.append(f"--{flag} {getattr(args, flag)}")
    if args.overlap_grad_reduce:
        parts.append("--overlap-grad-reduce")
    return " ".join(parts)


def parse_shard(text: str):
    """(K, N) from ``--shard K/N``; None when empty.

    >>> parse_shard("2/3"), parse_shard("")
    ((2, 3), None)
    >>> parse_shard("4/3")
    Traceback (most recent call last):
    ...
    megatron_zeppelin.errors.ZeppelinError: --shard 4/3: want K/N with 1 <= K <= N (e.g. --shard 1/2)
    """
    if not text:
        return None
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        k = n = 0
    if not 1 <= k <= n:
        raise ZeppelinError(f"--shard {text}: want K/N with 1 <= K <= N (e.g. --shard 1/2)")
    return k, n


def write_csv(records, path: str) -> None:
    with open(path, "w", newline="") as f:
        classes = (DocClass.LOCAL, DocClass.INTRA, DocClass.INTER)  # the CSV's column order
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS + classes, extrasaction="ignore")
        w.writeheader()
        for r in records:
            w.writerow({**r, **r.get("classes", {})})


def _fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_summary(out, summaries: dict) -> None:
    from megatron_zeppelin.sim.matrix import ablations, baselines
    for study, s in summaries.items():
        print(f"\nstudy {study}: Zeppelin's speedup (baseline's mean iteration over the run / Zeppelin's)", file=out)
        print(f"  {'baseline':<20}{'deployed: mean':>15}{'min':>7}{'max':>7}{'configs':>8}{'losses':>7}{'OOM':>5}"
              f"{'oracle: mean':>14}{'min':>7}{'max':>7}{'losses':>7}", file=out)
        for b, x in baselines(s["summary"]).items():
            d, o = x["deployed"], x["oracle"]
            print(f"  {b:<20}{_fmt(d['mean_speedup']):>15}{_fmt(d['min_speedup']):>7}{_fmt(d['max_speedup']):>7}"
                  f"{d['configs']:8d}{len(d['losses']):7d}{x['out_of_memory']:5d}{_fmt(o['mean_speedup']):>14}"
                  f"{_fmt(o['min_speedup']):>7}{_fmt(o['max_speedup']):>7}{len(o['losses']):7d}", file=out)
        for b, x in ablations(s["summary"]).items():  # Zeppelin's own variants, apart from the baselines
            d = x["deployed"]
            print(f"  Zeppelin's variant {b}: Zeppelin's speedup over it mean {_fmt(d['mean_speedup'])}, "
                  f"min {_fmt(d['min_speedup'])}, max {_fmt(d['max_speedup'])} ({d['configs']} configs)", file=out)
        lb = s["summary"].get("zeppelin_lower_bound")
        if lb:
            print(f"  Zeppelin / lower bound: mean {lb['mean']:.3f}, max {lb['max']:.3f}", file=out)
        if s.get("balance"):
            print("  imbalance (max/mean over ranks, mean over configs): " + "; ".join(
                f"{v} time {x['time_imbalance']:.2f} memory {x['memory_imbalance']:.2f}"
                for v, x in s["balance"].items()), file=out)
        for e in s.get("errors", []):
            print(f"  error: {e}", file=out)


def run(args) -> int:
    if args.validate_cpu:
        return run_validation(args)
    from megatron_zeppelin.sim.iteration import SimOptions
    from megatron_zeppelin.sim.matrix import Progress, load_matrix, resolve_matrix, run_matrix, summarize, summarize_by_study

    matrix_path = resolve_matrix(args.matrix)
    items, doc = load_matrix(matrix_path)
    if args.studies and args.studies != "all":
        want = [s.strip() for s in args.studies.split(",") if s.strip()]
        known = sorted({it[0].study for it in items})
        bad = [s for s in want if s not in known]
        if bad:
            raise ZeppelinError(f"--studies names {bad}, not in {matrix_path} (known: {', '.join(known)})")
        items = [it for it in items if it[0].study in want]
    if args.batches < 0:
        raise ZeppelinError(f"--batches {args.batches}: want at least 1 (or 0: each study's own)")
    if args.batches:
        from dataclasses import replace
        items = [(replace(spec, batches=args.batches), *rest) for spec, *rest in items]
    shard = parse_shard(args.shard)
    if shard is not None:
        k, n = shard
        total, items = len(items), items[k - 1::n]
        if not items:
            raise ZeppelinError(f"--shard {args.shard} selects none of the {total} configuration(s): use N <= {total}")
        print(f"shard {k}/{n}: {len(items)} of {total} configuration(s)")
    # no timelines: the report simulates its Gantt cases again
    opts = SimOptions(overlap_grad_reduce=args.overlap_grad_reduce, timeline=False)
    if args.jobs < 1:
        raise ZeppelinError(f"--jobs {args.jobs}: want at least 1")
    if args.out_dir:
        return run_studies(args, items, matrix_path, opts)
    if args.report:
        raise ZeppelinError("--report needs --out-dir (the folder of the studies' JSON files it reads)")
    t0 = time.perf_counter()
    records = run_matrix(items, opts, progress=Progress.for_stream(args.no_progress), jobs=args.jobs)
    print(f"{len(items)} configuration(s), runs of {', '.join(sorted({str(it[0].batches) for it in items}))} "
          f"batch(es), simulated in {time.perf_counter() - t0:.0f} s")
    by_study = summarize_by_study(records)
    overall = summarize([r for r in records if not r["study"].startswith("ablation") and not r.get("profile_error")
                         and r.get("gpu_term_off", "nothing") == "nothing"])
    print_summary(sys.stdout, {"all (ablations excluded)": overall, **by_study})
    if args.json:
        cmd = command_line(args)
        doc_out = {"matrix": matrix_path, "command": cmd, "options": vars(opts),
                   "summary": overall["summary"], "balance": overall["balance"],
                   "studies": by_study, "runs": records}
        _write(args.json, lambda f: json.dump(doc_out, f, indent=1, default=float))
    if args.csv:
        try:
            write_csv(records, args.csv)
        except OSError as e:
            raise ZeppelinError(f"cannot write --csv {args.csv}: {e.strerror}") from None
        print(f"wrote {args.csv}")
    if args.plots:
        from megatron_zeppelin.plots.matrix import scaling_lines, speedup_bars
        os.makedirs(args.plots, exist_ok=True)
        for study in sorted({r["study"] for r in records}):
            if study == "scaling":
                scaling_lines(records, os.path.join(args.plots, "scaling.png"), study)
            speedup_bars(records, os.path.join(args.plots, f"speedup_{study}.png"), study)
        print(f"wrote plots to {args.plots}")
    return 0


def run_studies(args, items, matrix_path: str, opts) -> int:
    """--out-dir: every configuration of ``items`` (one pool over all studies, so ``--jobs`` stays busy),
    then DIR/<study>.json and .csv per study, each holding the command that reruns that study alone,
    and with --report the report from those files; the total time at the end."""
    from argparse import Namespace

    from megatron_zeppelin.sim.matrix import Progress, run_matrix, summarize, summarize_by_study
    if args.json or args.csv or args.shard:
        raise ZeppelinError("--out-dir writes one JSON and CSV per study: drop --json, --csv and --shard")
    t0 = time.perf_counter()
    print(f"{len(items)} configuration(s) of {len({it[0].study for it in items})} studies, {args.jobs} at a time")
    records = run_matrix(items, opts, progress=Progress.for_stream(args.no_progress), jobs=args.jobs)
    print(f"simulated in {time.perf_counter() - t0:.0f} s")
    paths = []
    for study, summary in summarize_by_study(records).items():
        mine = [r for r in records if r["study"] == study]
        path = os.path.join(args.out_dir, f"{study}.json")
        one = Namespace(**{**vars(args), "studies": study, "json": path, "csv": os.path.splitext(path)[0] + ".csv",
                           "plots": None})
        doc_out = {"matrix": matrix_path, "command": command_line(one), "options": vars(opts),
                   "summary": summary["summary"], "balance": summary["balance"],
                   "studies": {study: summary}, "runs": mine}
        _write(path, lambda f: json.dump(doc_out, f, indent=1, default=float))
        try:
            write_csv(mine, one.csv)
        except OSError as e:
            raise ZeppelinError(f"cannot write {one.csv}: {e.strerror}") from None
        paths.append(path)
    overall = summarize([r for r in records if not r["study"].startswith("ablation") and not r.get("profile_error")
                         and r.get("gpu_term_off", "nothing") == "nothing"])
    print_summary(sys.stdout, {"all (ablations excluded)": overall})
    if args.report:
        from megatron_zeppelin.commands import report
        figures = args.figures or os.path.join(os.path.dirname(args.report) or ".", "figures")
        whole = " ".join(["zeppelin bench"] + ([f"--matrix {args.matrix}"] if args.matrix else []) +
                         [f"--studies {args.studies or 'all'}"] + ([f"--batches {args.batches}"] if args.batches else [])
                         + [f"--jobs {args.jobs}", f"--out-dir {args.out_dir}", f"--report {args.report}",
                            f"--figures {figures}"] + ([f"--validation {args.validation}"] if args.validation else []))
        report.run(Namespace(matrix=args.matrix, results=paths, validation=args.validation, out=args.report,
                             figures=figures, no_progress=True, debug=args.debug, made_with=whole,
                             previous=args.previous, started=t0))
    print(f"total {time.perf_counter() - t0:.0f} s ({len(items)} configurations, --jobs {args.jobs})")
    return 0


def _write(path, fn):
    try:
        d = os.path.dirname(path)
        if d:
            os.makedirs(d, exist_ok=True)
        with open(path, "w") as f:
            fn(f)
    except OSError as e:
        raise ZeppelinError(f"cannot write {path}: {e.strerror}") from None
    print(f"wrote {path}")


def run_validation(args) -> int:
    """Calibrate and measure in one spawned run per world size (validation/validate.py), then simulate."""
    from megatron_zeppelin.validation.validate import BACKGROUND_MAX, validate
    worlds = args.world or [2, 4]
    for w in worlds:
        if w < 1 or (w >= 4 and w % 2):
            raise ZeppelinError(f"--world {w}: use 1, 2 or an even number of ranks (2 virtual nodes from 4 on)")
    os.makedirs(args.profiles, exist_ok=True)
    rows, profiles = [], []
    for w in worlds:
        cpu, vrows = validate(w, repeat=args.repeat, calib_repeat=args.repeat)
        prof, host = cpu
        path = os.path.join(args.profiles, f"{prof.name}.yaml")
        cpu.save(path)  # the profile, and its host: section (spec/host.py) that only CPU profiles have
        profiles.append(cpu.to_dict())  # kept with the rows: a run's misses are read against its profile
        print(f"world {w}: attention fwd {min(prof.attn_fwd_tflops) * 1e3:.2f}..{max(prof.attn_fwd_tflops) * 1e3:.2f} "
              f"GFLOP/s, {prof.attn_call_fwd_us:.0f}/{prof.attn_call_bwd_us:.0f} us per kernel call + "
              f"{prof.attn_seq_fwd_us:.0f}/{prof.attn_seq_bwd_us:.0f} us per sequence (fwd/bwd), a split one "
              f"+{host.split_fwd_us:.0f}/{host.split_bwd_us:.0f} us + {host.split_row_fwd_us:.2f}/"
              f"{host.split_row_bwd_us:.2f} us per row, "
              f"GEMM {prof.gemm_tflops * 1e3:.1f} GFLOP/s, p2p {prof.nvlink_GBps:.2f} GB/s + "
              f"{prof.nvlink_latency_us:.0f} us; {host.cores:.2f} host cores (samples "
              f"{', '.join(f'{c:.2f}' for c in vrows[0]['host_cores_per_sample']) if vrows else '-'}), copies "
              f"{host.copy_GBps:.1f} GB/s; engine {host.post_us:.0f} us per Post, "
              f"{host.wait_us:.0f} us per Wait + landing {host.land_GBps:.1f} GB/s, packing "
              f"{host.pack_GBps:.1f} GB/s; wrote {path}")
        for r in vrows:
            rows.append(r)
            bg = statistics.median(r["background_cores"]) if r["background_cores"] else float("nan")
            print(f"  {r['strategy']:<13} measured {r['measured_s'] * 1e3:8.1f} ms   simulated "
                  f"{r['predicted_s'] * 1e3:8.1f} ms   error {100 * r['error']:+6.1f}% (CPU {100 * r['cpu_error']:+5.1f}%; "
                  f"at calibration speed {100 * r['error_at_calibration']:+6.1f}%, host "
                  f"{min(r['host_speed']):.2f}..{max(r['host_speed']):.2f})   "
                  f"{r['classes']}   "
                  f"others {bg:.2f} cores" + ("" if r["clean"] else " (no clean repeat: machine busy)"))
    def spread(key):  # mean and max |error| of one error column over every row
        errs = [abs(r[key]) for r in rows]
        return f"mean |error| {100 * sum(errs) / len(errs):.1f}%, max {100 * max(errs):.1f}%"
    print(f"{spread('error')} over {len(rows)} runs")
    print(f"at the calibration's host speed (validation/host_speed.py): {spread('error_at_calibration')}")
    if args.json:
        doc = {"note": "Engine forward + backward of one layer's core attention (8 heads, 4 KV heads, head_dim 32, "
                       "float32), slowest rank from a common barrier, median over the repeats where other "
                       f"processes kept at most {BACKGROUND_MAX} cores busy (background_cores per repeat); "
                       "simulated with the profile calibrated in the same spawned run (single-core rates, the "
                       "host's cores shared among the ranks computing at once, the engine's CPU per Post and "
                       "Wait; every figure the median of three calibrations: before, mid-way through and after "
                       "the timed repeats); `profiles` holds each world's, its `host` section the host's terms. "
                       "`error_at_calibration`: the same against each "
                       "repeat's time scaled by the host's speed around it (`host_speed`: a reference round on "
                       "every rank before and after the pass, against the rounds around the calibrations; "
                       "validation/host_speed.py). `host_cores_per_sample`: each calibration's own host_cores "
                       "(the profile's is the median over all their rounds).",
               "command": " ".join(["zeppelin bench --validate-cpu"] + [f"--world {w}" for w in worlds] +
                                   [f"--repeat {args.repeat}", f"--json {args.json}"]),
               "rows": rows, "profiles": profiles}
        _write(args.json, lambda f: json.dump(doc, f, indent=1))
    return 0
