"""Host speed: what this host delivers to all ranks at one moment, timed with one short fixed kernel.

A shared host drifts: one core of this project's 2-vCPU machines ran the same GEMM at 36-62 GFLOP/s
within two minutes (validation_probes/bench_host_drift.py), more than the validation's 15% goal. So the
validation times a reference round on every rank next to each timed pass and each calibration
sample: all ranks at once from a barrier run the same fixed work (REF_DOCS documents of the sharing
probe's block sequence, forward and backward, on the engine's own block path), and the round takes
until the slowest is done, as a pass does. A pass's time at the calibration's host speed is its
time times the ratio of the calibration's reference round to the reference rounds around it
(``at_calibration``); the validation reports that error beside the raw one.

>>> speed = host_speed([0.050, 0.052, 0.048], [0.060, 0.060])  # slower now than when calibrated
>>> round(speed, 6)
0.833333
>>> round(at_calibration(0.120, speed), 6)  # the pass would have taken 100 ms at calibration speed
0.1
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

REF_DOCS = 32  # documents of the reference round (~30-50 ms alone here: short next to a pass)


def reference(rank: int) -> Callable[[], None]:
    """The reference round's work on this rank: a fixed block sequence, forward then backward."""
    from megatron_zeppelin.validation.concurrent import SHARE_CHUNK, _probe
    fwd, bwd = _probe(rank, SHARE_CHUNK, ndocs=REF_DOCS)[:2]

    def run():
        fwd()
        bwd()
    return run


def reference_round(work: Callable[[], None]) -> float:
    """Seconds of one reference round on this rank, from a barrier every rank enters (the round's
    time is the slowest rank's: ``max`` over ranks)."""
    import torch.distributed as dist
    dist.barrier()
    t = time.perf_counter()
    work()
    return time.perf_counter() - t


def host_speed(calibration: Sequence[float], now: Sequence[float]) -> float:
    """The host's speed now relative to its calibration: the median reference round while calibrating
    over the mean of the rounds around this moment (below 1: slower now)."""
    return statistics.median(calibration) / statistics.fmean(now)


def at_calibration(seconds: float, speed: float) -> float:
    """A time measured at host speed ``speed`` (``host_speed``), as it would be at calibration speed."""
    return seconds * speed
