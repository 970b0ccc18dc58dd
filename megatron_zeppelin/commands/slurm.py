"""`zeppelin slurm`: render (and submit) one SLURM job per run x mode of a matrix; collect results."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from megatron_zeppelin.errors import ZeppelinError


def add_parser(sub):
    p = sub.add_parser("slurm", help="render/submit SLURM jobs for Zeppelin and stock Megatron DP/CP; "
                                     "collect their measured tokens per second",
                       description="Render one sbatch script per run and mode (zeppelin, dp, cp_p2p, "
                                   "cp_a2a_p2p, cp_all_gather) from a matrix YAML, check that every job's "
                                   "interpreter, data and entry script exist where the job will look for them, "
                                   "then print (--dry-run) or submit them. With --collect, tabulate finished "
                                   "job logs (tokens per second, iteration time), name every failed job, and "
                                   "write JSON/CSV.")
    p.add_argument("--matrix", help="matrix YAML, or a preset's name: slurm_example, slurm_cpu "
                                    "(megatron_zeppelin/presets/runs/)")
    p.add_argument("--out", default="out/slurm", help="where rendered job scripts go (default out/slurm)")
    p.add_argument("--dry-run", action="store_true", help="print the sbatch commands instead of submitting")
    p.add_argument("--no-check", action="store_true",
                   help="render without checking that python, data_path and the entry scripts exist (for "
                        "rendering on a machine other than the cluster's login node)")
    p.add_argument("--tiny-data", metavar="PREFIX",
                   help="write a tiny Megatron indexed dataset at PREFIX (.bin/.idx; byte tokens, each document "
                        "ending in NullTokenizer's 255): the data of presets/runs/slurm_cpu.yaml; kept if it exists")
    p.add_argument("--collect", metavar="LOG_DIR", help="parse job logs in LOG_DIR instead of rendering")
    p.add_argument("--warmup", type=int, default=3, help="iterations dropped before the median (default 3)")
    p.add_argument("--json", help="results JSON (with --collect)")
    p.add_argument("--csv", help="results CSV (with --collect)")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.tiny_data:
        return _tiny_data(args.tiny_data)
    if args.collect:
        return _collect(args)
    if not args.matrix:
        raise ZeppelinError("pass --matrix FILE (or --collect LOG_DIR, or --tiny-data PREFIX)")
    from megatron_zeppelin.slurm.checks import check_jobs
    from megatron_zeppelin.slurm.jobs import render_jobs

    jobs = render_jobs(args.matrix, args.out)  # as sbatch, called from here, will run them
    problems = [] if args.no_check else check_jobs(jobs)
    if problems:
        for line in problems:
            print(f"zeppelin slurm: error: {line}", file=sys.stderr)
        raise ZeppelinError(f"{len(problems)} problem(s) above in {args.matrix}: nothing rendered or submitted "
                            "(fix the matrix keys named; --no-check renders without these checks)")
    os.makedirs(args.out, exist_ok=True)
    for d in sorted({os.path.join(j.workdir, j.log_dir) for j in jobs}):
        os.makedirs(d, exist_ok=True)  # sbatch does not create the --output directory
    for j in jobs:
        with open(j.path, "w") as f:
            f.write(j.script)
        os.chmod(j.path, 0o755)
    if args.dry_run:
        for j in jobs:
            print(f"sbatch {j.path}")
        print(f"# {len(jobs)} job(s) rendered under {args.out}; submit without --dry-run")
        return 0
    if shutil.which("sbatch") is None:
        raise ZeppelinError("sbatch not found: run on a SLURM login node, or use --dry-run")
    for j in jobs:
        out = subprocess.run(["sbatch", j.path], capture_output=True, text=True)
        if out.returncode:
            raise ZeppelinError(f"sbatch {j.path} failed: {out.stderr.strip()}")
        print(out.stdout.strip(), f"({j.name} {j.mode})")
    return 0


def _collect(args) -> int:
    """The table of finished jobs; every job without a result is named with why, and the exit is 1."""
    from megatron_zeppelin.slurm.results import FAILED, collect, table, why_failed, write_results

    recs = collect(args.collect, args.warmup)
    if not recs:
        raise ZeppelinError(f"no job logs with a [zeppelin-slurm] header in {args.collect}")
    print(table(recs))
    write_results(recs, args.json, args.csv)
    failed = [r for r in recs if r["status"] in FAILED]
    short = [r for r in recs if r["status"] == "ok" and r["tokens_per_s"] is None]
    for r in failed:
        print(f"zeppelin slurm: failed: {why_failed(r)}", file=sys.stderr)
    for r in short:
        print(f"zeppelin slurm: no result: {r['run']} {r['mode']} ({r['log']}): all its {r['train_iters']} "
              f"iterations are within --warmup {args.warmup}: lower --warmup", file=sys.stderr)
    return 1 if (failed or short) else 0


def _tiny_data(prefix: str) -> int:
    if os.path.isfile(prefix + ".bin") and os.path.isfile(prefix + ".idx"):
        print(f"{prefix}.bin/.idx exist: kept")
        return 0
    from megatron_zeppelin.integration.byte_documents import write_byte_documents

    write_byte_documents(prefix)
    print(f"wrote {prefix}.bin and {prefix}.idx (400 byte-token documents of 8-600 tokens, each ending in 255)")
    return 0
