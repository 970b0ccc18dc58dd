"""Zeppelin at every recompute rung of a config (the bench tries only the first that fits)."""
import sys, time, json
from megatron_zeppelin.sim.matrix import load_matrix
from megatron_zeppelin.sim import runs as R
items, _ = load_matrix()
spec, variants, cps = next((s, v, c) for s, v, c in items if sys.argv[1] in s.key())
print(spec.key(), R.recompute_rungs(spec), flush=True)
orig = R.recompute_rungs
import os
only = os.environ.get('RUNGS')
for rc, cap in orig(spec):
    if only and rc not in only.split(';'):
        continue
    R.recompute_rungs = lambda s, rc=rc, cap=cap: [(rc, cap)]
    t = time.time()
    try:
        rec = R.run_config(spec, ["zeppelin"], None, cps)[0]
        print(f"{rc:40s} cap {cap:6d} it {rec.get('iteration_s')} batches {rec.get('batch_iteration_s')} err {rec.get('error')[:100]} ({time.time()-t:.0f} s)", flush=True)
    except Exception as e:
        print(rc, "error", e)
