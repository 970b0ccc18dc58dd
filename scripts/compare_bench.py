"""Compare two `zeppelin bench --json` files run by run: every number of the runs both hold must agree.

    .venv/bin/python scripts/compare_bench.py OLD.json NEW.json

Timing fields (plan_s, sim_s: this machine's clock) and fields only one file has are not compared.
Exit status 1 when any number differs.
"""
import json
import sys

CLOCK = {"plan_s", "sim_s"}


def runs(path):
    return {(r["key"], r["variant"]): r for r in json.load(open(path))["runs"]}


def main(old, new):
    a, b = runs(old), runs(new)
    common = sorted(set(a) & set(b))
    bad = 0
    for k in common:
        for f in sorted(set(a[k]) & set(b[k]) - CLOCK):
            if a[k][f] != b[k][f]:
                bad += 1
                print(f"{k[0]} {k[1]} {f}: {a[k][f]!r} -> {b[k][f]!r}")
    print(f"{len(common)} runs compared ({len(set(a) - set(b))} only in {old}, {len(set(b) - set(a))} only in "
          f"{new}): {bad} differing field(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
