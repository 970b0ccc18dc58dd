"""Timing of a callable on CPU or CUDA: warm-up, then every repeat (CUDA events on GPUs); callers keep
the fastest.

The minimum, not the median: on a shared machine other processes only ever add time, and a rate
that a busy moment halved would mislead the planner for the whole run."""

from __future__ import annotations

import time
from typing import Callable, List

import torch


def all_seconds(fn: Callable[[], object], device: str, repeats: int = 5, warmup: int = 1) -> List[float]:
    """Every timed repeat (their spread says how noisy the machine was; calibrate/noise.py)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return times
