"""Host drift: how steady one core of this machine is over minutes, with nothing else to blame.

The CPU validation (`zeppelin bench --validate-cpu`) compares runs against a profile calibrated a
few minutes around them; if the host's single-core speed moves by more than the goal's 15% within
that time, no model can meet it there. This benchmark times one fixed kernel (the validation model's
GEMM: 1024 x hidden x ffn, float32, one thread) back to back in windows of ``--window`` seconds for
``--seconds`` seconds and writes every window's GFLOP/s and their spread (min, p5, median, p95,
max; p95 / p5). Run it on an otherwise idle machine, right before or after the validation.

    .venv/bin/python validation_probes/bench_host_drift.py --seconds 120 --json out/host_drift.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Dict, Sequence


def summarise(rates: Sequence[float]) -> Dict:
    """Spread of per-window rates.

    >>> s = summarise([float(x) for x in range(1, 101)])
    >>> s["min"], s["median"], s["max"], s["p5"], s["p95"], s["p95_over_p5"]
    (1.0, 50.5, 100.0, 5.95, 95.05, 15.975)
    """
    q = statistics.quantiles(rates, n=20, method="inclusive")
    return {"windows": len(rates), "min": min(rates), "p5": round(q[0], 6), "median": statistics.median(rates),
            "p95": round(q[-1], 6), "max": max(rates), "p95_over_p5": round(q[-1] / q[0], 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="how long to time (default 120)")
    ap.add_argument("--window", type=float, default=1.0, help="seconds per reported rate (default 1)")
    ap.add_argument("--json", default="", help="write the windows and their spread here")
    args = ap.parse_args(argv)
    import torch

    from megatron_zeppelin.validation.concurrent import CPU_MODEL
    torch.set_num_threads(1)  # one core, as each rank of the validation
    m = CPU_MODEL
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1024, m.hidden, generator=g), torch.randn(m.hidden, m.ffn, generator=g)
    flops = 2.0 * 1024 * m.hidden * m.ffn
    rates, end = [], time.perf_counter() + args.seconds
    while time.perf_counter() < end:
        t, n = time.perf_counter(), 0
        while time.perf_counter() - t < args.window:
            x @ w
            n += 1
        rates.append(flops * n / (time.perf_counter() - t) / 1e9)
    out = {"command": "validation_probes/bench_host_drift.py", "unit": "GFLOP/s per window, one thread",
           "window_s": args.window, "summary": summarise(rates), "rates": [round(r, 3) for r in rates]}
    s = out["summary"]
    print(f"{s['windows']} windows of {args.window:g} s: {s['min']:.1f} .. {s['max']:.1f} GFLOP/s "
          f"(p5 {s['p5']:.1f}, median {s['median']:.1f}, p95 {s['p95']:.1f}; p95/p5 {s['p95_over_p5']:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
