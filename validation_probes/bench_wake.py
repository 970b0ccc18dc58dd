"""A core's compute right after its process slept, against the same compute back to back.

The CPU validation's profile times each probe in a hot loop (validation/concurrent.py), while a rank
of a measured pass sleeps wherever it waits: at the barrier before the pass, in a Wait whose message
is not in yet. This times the engine's own block paths (the calibration's ``_probe`` over ring
blocks, ``_local_probe`` over local documents) on one core, each call after ``time.sleep(s)``, for
a few ``s``; the median of ``--repeat`` calls each, and its ratio to the hot-loop median (s = 0).
Two controls: a 100 ms sleep followed by ``w`` ms of busy GEMMs before the call (does busy work
bring the speed back?), and no sleep but 64 MB written before each call (is it cold data caches?).

    .venv/bin/python validation_probes/bench_wake.py --json out/bench_wake.json

Timings on a shared machine are noisy: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

SLEEPS = (0.0, 0.002, 0.02, 0.1)
WARMS = (0.005, 0.02, 0.1)  # busy seconds after a 100 ms sleep
EVICT_BYTES = 64 << 20


def _timed(fn, sleep: float, repeat: int, before=None) -> float:
    times = []
    for i in range(repeat + 1):  # the first is a warm-up
        if sleep:
            time.sleep(sleep)
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15, help="timed calls per shape and sleep")
    ap.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args(argv)
    import torch

    from megatron_zeppelin.validation.concurrent import _local_probe, _probe
    from megatron_zeppelin.validation.heap import keep_heap
    torch.set_num_threads(1)
    keep_heap()
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    junk = torch.zeros(EVICT_BYTES // 4)

    def busy(seconds):
        def run():
            t = time.perf_counter()
            while time.perf_counter() - t < seconds:
                a @ b
        return run
    shapes = {"ring blocks, 16 documents of 4 x ~128 tokens": _probe(0, 128, 16, True)[:2],
              "local, 40 documents of ~96 tokens": _local_probe(0, 96, 40)[:2],
              "local, 8 documents of ~512 tokens": _local_probe(0, 512, 8)[:2]}
    out = {"command": "validation_probes/bench_wake.py", "sleeps_s": list(SLEEPS), "warms_s": list(WARMS),
           "evict_bytes": EVICT_BYTES, "shapes": {}}
    for name, (fwd, bwd) in shapes.items():
        row = {}
        for pass_, fn in (("forward", fwd), ("backward", bwd)):
            got = [_timed(fn, s, args.repeat) for s in SLEEPS]
            warm = [_timed(fn, 0.1, args.repeat, busy(w)) for w in WARMS]
            evict = _timed(fn, 0.0, args.repeat, lambda: junk.add_(1.0))
            row[pass_] = {"seconds": got, "ratio": [g / got[0] for g in got],
                          "warm_ratio": [w / got[0] for w in warm], "evict_ratio": evict / got[0]}
            print(f"{name:46s} {pass_:8s} " + "  ".join(
                f"sleep {s * 1e3:3.0f} ms: {g * 1e3:6.2f} ms ({g / got[0]:.2f})" for s, g in zip(SLEEPS, got)))
            print(f"{'':55s} sleep 100 ms, then busy " + ", ".join(
                f"{w * 1e3:.0f} ms: {x / got[0]:.2f}" for w, x in zip(WARMS, warm)) + f";  caches evicted: {evict / got[0]:.2f}")
        out["shapes"][name] = row
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}")
    return out


if __name__ == "__main__":
    main()
