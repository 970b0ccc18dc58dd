"""Settings that cannot be deployed nor be any batch's oracle are not simulated to the end.

The bench simulates every run-level setting of a baseline (CP sizes and comm types, dynamic_cp's
max_seqlen_per_dp_cp_rank) on every batch, to deploy the one of least mean and to find each batch's
oracle (sim/runs.py ``deployed_and_oracle``). Many settings are several times slower than the best
(dynamic_cp at a small max_seqlen_per_dp_cp_rank puts documents on rings of 64 ranks), and they
are the costliest to simulate. A simulation only adds time as it goes: after a micro-batch, a round
or a forward pass its time so far is a lower bound of the whole. Once that bound is above both this
batch's best time so far (so the setting is not the batch's oracle) and what the setting may still
spend while its mean stays below the best mean so far (so it is not deployed), the setting's time
for the batch is ``DOMINATED``: every number reported is the same as when it ran to the end.

    >>> times = {}                          # the bench's {setting: [seconds per batch]}
    >>> seen = Dominated(2, times)
    >>> seen.beyond("cp4", 0) is None       # nothing simulated yet: run to the end
    True
    >>> seen.done("cp4", 0, 3.0); seen.done("cp4", 1, 5.0)   # cp4: mean 4.0
    >>> round(seen.beyond("cp8", 0), 6)     # above cp4's 3.0, and above 8.0 - 0.0 (a mean above 4.0)
    8.0
    >>> seen.done("cp8", 0, 6.0); round(seen.beyond("cp8", 1), 6)   # 8.0 - 6.0 = 2.0 < cp4's 5.0
    5.0
    >>> seen.done("cp16", 0, DOMINATED); round(seen.beyond("cp16", 1), 6)   # not deployable: batch 1's best
    5.0
    >>> times["cp8"]
    [6.0]
"""

from __future__ import annotations

import math
from typing import Dict, Hashable, List, Optional

DOMINATED = math.inf  # a setting's time for a batch where it stopped: above every bound that mattered
MARGIN = 1e-9  # relative: the comparisons of sums and means must not decide a tie by rounding


class Beyond(Exception):
    """A simulation stopped where its time so far passed the bound it was given."""

    def __init__(self, seconds: float):
        super().__init__(f"{seconds:.6g} s so far: beyond the bound")
        self.seconds = seconds


class Dominated:
    """What the settings simulated so far allow the next one to skip: per batch the least time,
    over the settings that finished every batch the least total. ``times``: per setting its times
    so far (``DOMINATED`` where it stopped, None where it does not fit), filled by ``done``."""

    def __init__(self, batches: int, times: Dict[Hashable, List[Optional[float]]]):
        self.batches, self.times = batches, times
        self.best: List[float] = [math.inf] * batches
        self.best_total = math.inf

    def done(self, key: Hashable, batch: int, seconds: Optional[float]) -> None:
        """Setting ``key``'s time for ``batch`` (None: out of memory; DOMINATED: stopped), added
        to ``times``."""
        ts = self.times.setdefault(key, [])
        ts.append(seconds)
        if seconds is not None and seconds < self.best[batch]:
            self.best[batch] = seconds
        if len(ts) == self.batches and all(t is not None for t in ts):
            self.best_total = min(self.best_total, sum(ts))

    def beyond(self, key: Hashable, batch: int) -> Optional[float]:
        """The time above which setting ``key`` may stop on ``batch``, or None (run to the end)."""
        best = self.best[batch]
        if best == math.inf:
            return None
        ts = self.times.get(key, [])
        if any(t is None or t == DOMINATED for t in ts):  # not deployable any more: the batch's oracle only
            return best * (1 + MARGIN)
        if self.best_total == math.inf:  # no setting to compare its mean with yet
            return None
        return max(best, self.best_total - sum(ts)) * (1 + MARGIN)
