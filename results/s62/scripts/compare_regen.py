"""Every record of a regeneration (NEW: its results/bench) against the one it replaces (OLD), timing
fields aside (plan_s, sim_s):

    .venv/bin/python results/s62/scripts/compare_regen.py NEW_DIR OLD_DIR
"""
import json, glob, os, sys
TIMING = {"plan_s", "sim_s"}
def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k not in TIMING}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x


def main(NEW, OLD):
    total = diff = 0
    for f in sorted(glob.glob(f"{NEW}/*.json")):
        b = os.path.basename(f)
        if not os.path.exists(f"{OLD}/{b}"):
            print("new file", b); continue
        a, n = json.load(open(f"{OLD}/{b}")), json.load(open(f))
        if not isinstance(a, dict) or "runs" not in a:
            print(f"{b}: not a study file ({'same' if a == n else 'differs'})"); continue
        A = {(r["key"], r["variant"]): strip(r) for r in a["runs"]}
        B = {(r["key"], r["variant"]): strip(r) for r in n["runs"]}
        changed = [k for k in set(A) | set(B) if A.get(k) != B.get(k)]
        total += len(B); diff += len(changed)
        rest = {k: (strip(a[k]) == strip(n[k])) for k in a if k != "runs" and k in n}
        print(f"{b}: {len(B)} records, {len(changed)} differ; other parts equal: {all(rest.values())} {[k for k, v in rest.items() if not v]}")
        for k in changed[:5]:
            fa, fb = A.get(k, {}), B.get(k, {})
            print("   ", k, [x for x in set(fa) | set(fb) if fa.get(x) != fb.get(x)][:8])
    print("records", total, "differ", diff)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
