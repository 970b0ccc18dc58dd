"""The bench (``zeppelin bench``) of this tree against another, side by side: its seconds per
configuration and whether every record is the same. For a change meant to make the regeneration of
docs/results.md faster without moving any number (issue 53's 30 minutes).

The two trees run the same slice of the matrix (``--studies``, ``--shard K/N``: every N-th
configuration from the K-th, so every study is in it) at the same time, one process each, so a
shared host's load moves both alike; the ratio of their seconds is the number to read, not either
time. Records are compared field by field but for the clock (``plan_s``, ``sim_s``) and the
settings a tree stopped early (``tried`` compared where both simulated a setting to the end;
``dominated``: sim/dominated.py).

    git archive <commit> megatron_zeppelin | tar -x -C results/s55/base
    PYTHONPATH=. .venv/bin/python benchmarks/bench_matrix_compare.py --compare-src results/s55/base \
        --shard 1/8 --out-dir results/s55/paired
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLOCK = {"plan_s", "sim_s", "tried", "dominated"}
LINE = re.compile(r"\[\d+/\d+\] (\S+) done in ([\d.]+) s")


def _start(src: str, out_dir: str, name: str, studies: str, shard: str):
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
    cmd = [sys.executable, "-m", "megatron_zeppelin.cli", "bench", "--studies", studies, "--shard", shard,
           "--json", os.path.join(out_dir, f"{name}.json")]
    log = open(os.path.join(out_dir, f"{name}.log"), "w")
    # run from the output folder: the tree on PYTHONPATH is the one imported, not the working directory's
    return subprocess.Popen(cmd, env=env, cwd=out_dir, stdout=log, stderr=subprocess.STDOUT), log


def seconds(log_path: str) -> dict:
    """{configuration key: seconds} from a bench's progress lines."""
    with open(log_path) as f:
        return {m.group(1): float(m.group(2)) for m in map(LINE.match, f) if m}


def differences(old: list, new: list) -> list:
    """Every field of every record that differs (the clock and early-stopped settings aside)."""
    out = []
    if len(old) != len(new):
        return [f"{len(old)} records against {len(new)}"]
    for a, b in zip(old, new):
        for k in sorted((set(a) | set(b)) - CLOCK):
            if a.get(k) != b.get(k):
                out.append(f"{a.get('key')} {a.get('variant')} {k}: {str(a.get(k))[:80]} | {str(b.get(k))[:80]}")
        ta, tb = a.get("tried", {}), b.get("tried", {})
        out += [f"{a.get('key')} {a.get('variant')} tried {s}: {ta[s]} | {tb.get(s)}"
                for s in ta if ta[s] is not None and tb.get(s) is not None and ta[s] != tb[s]]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare-src", required=True, help="the other tree (its megatron_zeppelin/ is imported)")
    ap.add_argument("--studies", default="all")
    ap.add_argument("--shard", default="1/8", help="K/N: every N-th configuration from the K-th")
    ap.add_argument("--out-dir", default="results/bench_compare")
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    out_dir = os.path.abspath(args.out_dir)
    t0 = time.perf_counter()
    runs = [_start(src, out_dir, name, args.studies, args.shard) for name, src in (("old", args.compare_src),
                                                                                    ("new", HERE))]
    for p, log in runs:
        p.wait()
        log.close()
    if any(p.returncode for p, _ in runs):
        print(f"a bench failed: see {out_dir}/old.log and new.log", file=sys.stderr)
        return 1
    old_s, new_s = seconds(os.path.join(out_dir, "old.log")), seconds(os.path.join(out_dir, "new.log"))
    keys = [k for k in old_s if k in new_s]
    by_study = defaultdict(lambda: [0, 0.0, 0.0])
    for k in keys:
        s = by_study[k.split("/")[0]]
        s[0], s[1], s[2] = s[0] + 1, s[1] + old_s[k], s[2] + new_s[k]
    recs = [json.load(open(os.path.join(out_dir, f"{n}.json")))["runs"] for n in ("old", "new")]
    diff = differences(*recs)
    total_old, total_new = sum(old_s[k] for k in keys), sum(new_s[k] for k in keys)
    summary = {"compare_src": args.compare_src, "studies": args.studies, "shard": args.shard,
               "configurations": len(keys), "old_s": total_old, "new_s": total_new, "ratio": total_old / total_new,
               "by_study": {k: {"configurations": c, "old_s": a, "new_s": b, "ratio": a / b}
                            for k, (c, a, b) in sorted(by_study.items(), key=lambda kv: -kv[1][1])},
               "records": len(recs[1]), "differences": diff,
               "dominated": sum(len(r.get("dominated") or ()) for r in recs[1]),
               "wall_s": time.perf_counter() - t0, "load_average": os.getloadavg()[0]}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"{len(keys)} configurations: old {total_old:.0f} s, new {total_new:.0f} s, old / new "
          f"{total_old / total_new:.3f}; {len(recs[1])} records, {len(diff)} differences")
    for k, v in summary["by_study"].items():
        print(f"  {k:20s} {v['configurations']:3d}  {v['old_s']:7.1f} -> {v['new_s']:7.1f} s  x{v['ratio']:.2f}")
    for d in diff[:20]:
        print("  DIFF", d)
    print(f"wrote {out_dir}/summary.json")
    return 1 if diff else 0


if __name__ == "__main__":
    raise SystemExit(main())
