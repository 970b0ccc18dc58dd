"""Which configurations' simulated iteration moved between two versions of the study files: per
study, Zeppelin's (or ``--variant``'s) mean iteration in results/bench/<study>.json at git revision
``--rev`` against the working tree, the configurations that moved by more than ``--threshold``.
What a closing note explains beside docs/results.md's "This report against the previous one".

    .venv/bin/python scripts/results_moved.py --rev f6d93a0
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess


def _load(path: str, rev: str = ""):
    if not rev:
        with open(path) as f:
            return json.load(f)
    try:
        return json.loads(subprocess.check_output(["git", "show", f"{rev}:{path}"], stderr=subprocess.DEVNULL))
    except (subprocess.CalledProcessError, ValueError):
        return None


def _times(doc, variant: str):
    return {r["key"]: (r["label"], r.get("iteration_s")) for r in doc.get("runs", []) if r["variant"] == variant}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", required=True, help="the git revision of the previous study files")
    ap.add_argument("--dir", default="results/bench")
    ap.add_argument("--variant", default="zeppelin")
    ap.add_argument("--threshold", type=float, default=0.05, help="relative move to list (default 5%%)")
    args = ap.parse_args(argv)
    total = moved = faster = 0
    for path in sorted(glob.glob(os.path.join(args.dir, "*.json"))):
        new, old = _load(path), _load(path, args.rev)
        if not isinstance(new, dict) or "runs" not in new or not isinstance(old, dict):
            continue
        before, after = _times(old, args.variant), _times(new, args.variant)
        rows = []
        for key, (label, t) in after.items():
            total += 1
            t0 = before.get(key, (label, None))[1]
            if t and t0 and abs(t / t0 - 1) > args.threshold:
                rows.append((label, t0, t))
        moved += len(rows)
        faster += sum(1 for _, t0, t in rows if t < t0)
        print(f"{os.path.basename(path)}: {len(after)} configurations, {len(rows)} moved")
        for label, t0, t in rows:
            print(f"  {label}: {t0:.3f} -> {t:.3f} s ({t / t0 - 1:+.1%})")
    print(f"{args.variant}: {moved} of {total} configurations moved by more than {args.threshold:.0%}, "
          f"{faster} of them faster")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
