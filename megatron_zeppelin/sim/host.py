"""Host-CPU contention: ranks that share one machine's cores share its compute (processor sharing).

On GPUs every rank has its own device, so a kernel's seconds are fixed, and the simulator is given no
host (None). In the CPU validation all ranks are processes of one host with ``cores`` cores (a
spec/host.py HostModel, which only the validation passes in: ``simulate(..., host=)``), and the
scheduler shares the cores among the ranks that are computing: with n ranks busy, each runs at
min(1, cores / n) of one core, re-shared whenever a rank starts or stops computing (a rank blocked
in a wait() takes no core). The profile's rates are then single-core rates (calibrated with one rank
computing at a time), and a compute task is ``seconds`` of one core's work (events.TaskGraph.work)
over two resources, the rank's core (capacity 1) and the host (capacity ``cores``), sized by
the same max-min fair filling as network flows: that is exactly min(1, cores / n) per busy rank.

network.LinkTable(..., host=) holds the two resources; ``shared_makespan`` times one kernel
per rank started together (the vocab head, which the layer graphs leave out).

>>> shared_makespan([1.0, 1.0, 1.0, 1.0], 2)   # 4 equal kernels on 2 cores: 2x
2.0
>>> shared_makespan([1.0, 0.0, 0.0, 0.0], 2)   # one rank alone: a whole core
1.0
>>> shared_makespan([3.0, 1.0], 1)             # both at 1/2 until t = 2, then the long one alone
4.0
>>> shared_makespan([3.0, 1.0], 0)             # not modelled: the slowest rank
3.0
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from megatron_zeppelin.sim.events import TaskGraph


def shared_makespan(seconds: Sequence[float], cores: float) -> float:
    """Seconds until the last of one kernel per rank (single-core ``seconds``), all started at once,
    is done on ``cores`` shared cores (0: no sharing, the longest)."""
    if cores <= 0 or not len(seconds):
        return max(seconds, default=0.0)
    n = len(seconds)
    g = TaskGraph()
    for r, s in enumerate(seconds):
        g.work(s, (r, n))
    return g.run(np.array([1.0] * n + [float(cores)])).makespan
