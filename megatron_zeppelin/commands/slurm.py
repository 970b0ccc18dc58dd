"""`zeppelin slurm`: render (and submit) one SLURM job per run x mode of a matrix; collect results."""

from __future__ import annotations

import os
import shutil
import subprocess

from megatron_zeppelin.errors import ZeppelinError


def add_parser(sub):
    p = sub.add_parser("slurm", help="render/submit SLURM jobs for Zeppelin and stock Megatron DP/CP; "
                                     "collect their measured tokens per second",
                       description="Render one sbatch script per run and mode (zeppelin, dp, cp_p2p, "
                                   "cp_a2a_p2p, cp_all_gather) from a matrix YAML, then print (--dry-run) or "
                                   "submit them. With --collect, tabulate finished job logs (tokens per "
                                   "second, iteration time) and write JSON/CSV.")
    p.add_argument("--matrix", help="matrix YAML, or a preset's name: slurm_example, slurm_cpu "
                                    "(megatron_zeppelin/presets/runs/)")
    p.add_argument("--out", default="out/slurm", help="where rendered job scripts go (default out/slurm)")
    p.add_argument("--dry-run", action="store_true", help="print the sbatch commands instead of submitting")
    p.add_argument("--collect", metavar="LOG_DIR", help="parse job logs in LOG_DIR instead of rendering")
    p.add_argument("--warmup", type=int, default=3, help="iterations dropped before the median (default 3)")
    p.add_argument("--json", help="results JSON (with --collect)")
    p.add_argument("--csv", help="results CSV (with --collect)")
    p.set_defaults(func=run)


def run(args) -> int:
    from megatron_zeppelin.slurm.jobs import render_jobs
    from megatron_zeppelin.slurm.results import collect, table, write_results

    if args.collect:
        recs = collect(args.collect, args.warmup)
        if not recs:
            raise ZeppelinError(f"no job logs with a [zeppelin-slurm] header in {args.collect}")
        print(table(recs))
        write_results(recs, args.json, args.csv)
        return 0
    if not args.matrix:
        raise ZeppelinError("pass --matrix FILE (or --collect LOG_DIR)")
    jobs = render_jobs(args.matrix, args.out)
    os.makedirs(args.out, exist_ok=True)
    for d in sorted({j.log_dir for j in jobs}):
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
