"""Event engine: a graph of tasks (fixed delays and network flows) run to completion.

A *delay* takes fixed seconds once its predecessors are done (compute kernels; each rank's compute
stream is a chain of delays, so its kernels run one at a time in program order). A *flow* waits its
link latency, then moves its bytes over two links at the max-min fair rate it gets among all flows
active at the same time (network.fair_rates); rates are recomputed whenever a flow starts or ends.
A delay of 0 seconds is a join (e.g. "all of this rank's messages of a step are done").
A *work* task is a compute kernel on a shared host CPU (host.py): its seconds are one core's work,
done at the max-min fair rate it gets on two resources, its rank's core (capacity 1) and the host
(capacity = cores), exactly as a flow moves bytes over its two links: processor sharing.

One flow alone on a 100 B/s link takes latency + bytes / bandwidth; two flows sharing the port take
twice as long:

>>> import numpy as np
>>> g = TaskGraph()
>>> a = g.flow(1000, (0, 1), latency=0.5)
>>> done = g.delay(1.0, deps=[a])
>>> res = g.run(np.array([100.0, 100.0, 100.0]))
>>> float(res.end[a]), float(res.end[done])
(10.5, 11.5)
>>> g = TaskGraph(); x = g.flow(1000, (0, 1)); y = g.flow(1000, (0, 2))
>>> float(g.run(np.array([100.0, 100.0, 100.0])).end[y])
20.0

Four ranks' 1 s kernels on a host of 2 cores (resources: cores 0-3 of capacity 1, host 4 of
capacity 2) each run at half a core:

>>> g = TaskGraph(); w = [g.work(1.0, (r, 4)) for r in range(4)]
>>> float(g.run(np.array([1.0, 1.0, 1.0, 1.0, 2.0])).makespan)
2.0
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from megatron_zeppelin.sim.network import fair_rates, pad_links

DELAY, FLOW, WORK = 0, 1, 2  # WORK: compute sharing the host CPU (nbytes = core-seconds)


@dataclass
class RunResult:
    start: np.ndarray  # when each task's predecessors were done (a flow's latency starts here)
    end: np.ndarray
    makespan: float


class TaskGraph:
    def __init__(self):
        self.kind: List[int] = []
        self.dur: List[float] = []  # delay seconds, or a flow's latency
        self.nbytes: List[float] = []
        self.links: List[Tuple[int, int]] = []
        self.succ: List[List[int]] = []
        self.npred: List[int] = []
        self.tag: List[Optional[tuple]] = []  # (lane, category, label) for timelines; None = not shown

    def __len__(self) -> int:
        return len(self.kind)

    def _add(self, kind, dur, nbytes, links, deps, tag) -> int:
        i = len(self.kind)
        self.kind.append(kind)
        self.dur.append(float(dur))
        self.nbytes.append(float(nbytes))
        self.links.append(links)
        self.succ.append([])
        n = 0
        for d in deps:
            if d is not None:
                self.succ[d].append(i)
                n += 1
        self.npred.append(n)
        self.tag.append(tag)
        return i

    def delay(self, seconds: float, deps: Sequence[Optional[int]] = (), tag: Optional[tuple] = None) -> int:
        return self._add(DELAY, seconds, 0.0, (-1, -1), deps, tag)

    def join(self, deps: Sequence[Optional[int]]) -> int:
        return self._add(DELAY, 0.0, 0.0, (-1, -1), deps, None)

    def flow(self, nbytes: float, links: Tuple[int, int], latency: float = 0.0,
             deps: Sequence[Optional[int]] = (), tag: Optional[tuple] = None) -> int:
        if nbytes <= 0:  # nothing to move: only the latency remains
            return self._add(DELAY, latency, 0.0, (-1, -1), deps, tag)
        return self._add(FLOW, latency, nbytes, tuple(links), deps, tag)

    def work(self, seconds: float, links: Tuple[int, int], deps: Sequence[Optional[int]] = (),
             tag: Optional[tuple] = None) -> int:
        """``seconds`` of one core's compute on (rank's core, host) resources (network.LinkTable.cpu)."""
        if seconds <= 0:
            return self._add(DELAY, 0.0, 0.0, (-1, -1), deps, tag)
        return self._add(WORK, 0.0, seconds, tuple(links), deps, tag)

    def cpu_seconds(self) -> float:
        """Core-seconds of all the graph's WORK: its compute at one core's speed.

        >>> g = TaskGraph(); _ = g.work(1.0, (0, 2)); _ = g.work(0.5, (1, 2)); _ = g.delay(3.0)
        >>> g.cpu_seconds()
        1.5
        """
        return float(sum(b for k, b in zip(self.kind, self.nbytes) if k == WORK))

    def cpu_occupancy(self, res: "RunResult", cores: int) -> float:
        """CPU time the host's processes are charged in run ``res``: the integral of min(WORK tasks
        running, ``cores``). Where the host's capacity is below its cores (sharing loses speed), a
        task is charged for the whole time it runs, not for its work; this is what a measured CPU
        time is compared with.

        Two 1 s tasks on 2 cores that share them as 1.6 (each at 0.8): 2.5 s of CPU, for 2 s of work.

        >>> import numpy as np
        >>> g = TaskGraph(); w = [g.work(1.0, (r, 2)) for r in range(2)]
        >>> res = g.run(np.array([1.0, 1.0, 1.6]))
        >>> float(res.makespan), g.cpu_occupancy(res, 2)
        (1.25, 2.5)
        """
        ev = sorted((t, d) for i, k in enumerate(self.kind) if k == WORK
                    for t, d in ((float(res.start[i]), 1), (float(res.end[i]), -1)))
        total, n, last = 0.0, 0, 0.0
        for t, d in ev:
            total += min(n, cores) * (t - last)
            n, last = n + d, t
        return total

    def seconds(self, i: int) -> float:
        """A compute task's own seconds (its work at one core for WORK; the delay otherwise)."""
        return self.nbytes[i] if self.kind[i] == WORK else self.dur[i]

    def run(self, capacity: np.ndarray) -> RunResult:
        n = len(self.kind)
        start = np.full(n, np.nan)
        end = np.full(n, np.nan)
        npred = list(self.npred)
        heap: List[Tuple[float, int, int]] = []  # (time, task, what) what: 0 = delay done, 1 = flow starts moving
        act_ids: List[int] = []
        act_rem: List[float] = []
        rates = np.zeros(0)
        dirty = False
        # The fair rates are a function of the active flows' links (in order) alone, and a graph's
        # pattern of concurrent flows recurs (every ring step, every layer): computed once each.
        fair: dict = {}

        def ready(i: int, t: float):
            start[i] = t
            heapq.heappush(heap, (t + self.dur[i], i, 0 if self.kind[i] == DELAY else 1))  # flow or work: shared

        for i in range(n):
            if npred[i] == 0:
                ready(i, 0.0)
        t = 0.0
        done = 0
        while heap or act_ids:
            if dirty:
                key = tuple([self.links[i] for i in act_ids])
                rates = fair.get(key)
                if rates is None:  # never written in place below: a cached array can be shared
                    rates = fair[key] = fair_rates(*pad_links(list(key), capacity))
                dirty = False
            t_flow = np.inf
            if act_ids:
                rem = np.array(act_rem)
                left = rem / rates
                t_flow = t + float(left.min())
            t_heap = heap[0][0] if heap else np.inf
            t_new = min(t_flow, t_heap)
            finished: List[int] = []
            if act_ids:
                dt = t_new - t
                rem = rem - rates * dt
                # flows that end now (relative tolerance: they were due within rounding of t_new)
                fin = rem <= np.maximum(1e-9 * np.array([self.nbytes[i] for i in act_ids]), rates * 1e-12)
                if fin.any():
                    finished = [act_ids[k] for k in np.flatnonzero(fin)]
                    keep = np.flatnonzero(~fin)
                    act_ids = [act_ids[k] for k in keep]
                    act_rem = [float(rem[k]) for k in keep]
                    rates = rates[keep]
                    dirty = True
                else:
                    act_rem = rem.tolist()
            t = t_new
            while heap and heap[0][0] <= t:
                _, i, what = heapq.heappop(heap)
                if what == 0:
                    finished.append(i)
                else:
                    act_ids.append(i)
                    act_rem.append(self.nbytes[i])
                    rates = np.append(rates, 0.0)
                    dirty = True
            for i in finished:
                end[i] = t
                done += 1
                for s in self.succ[i]:
                    npred[s] -= 1
                    if npred[s] == 0:
                        ready(s, t)
        if done != n:
            raise RuntimeError(f"task graph has a cycle or dangling dependency: {n - done} of {n} tasks never ran")
        return RunResult(start, end, float(np.nanmax(end)) if n else 0.0)
