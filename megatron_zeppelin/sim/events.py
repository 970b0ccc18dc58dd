"""Event engine: a graph of tasks (fixed delays and network flows) run to completion.

A *delay* takes fixed seconds once its predecessors are done (compute kernels; each rank's compute
stream is a chain of delays, so its kernels run one at a time in program order). A *flow* waits its
link latency, then moves its bytes over two links at the max-min fair rate it gets among all flows
active at the same time (network.fair_shares); rates are recomputed whenever a flow starts or ends.
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
from math import inf, nan
from itertools import compress, repeat
from operator import gt, mul, not_, sub, truediv
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from megatron_zeppelin.sim.dominated import Beyond
from megatron_zeppelin.sim.network import fair_shares

DELAY, FLOW, WORK = 0, 1, 2  # WORK: compute sharing the host CPU (nbytes = core-seconds)
_FAIR: list = [None, {}]  # the last run's capacities, {key: (active link groups, their rates)}
_FAIR_MAX = 20_000


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

    def run(self, capacity: np.ndarray, until: float = inf) -> RunResult:
        """Every task's start and end, flows sharing ``capacity`` fairly; past ``until`` seconds of
        simulated time, raise sim/dominated.py ``Beyond`` (the makespan is at least that)."""
        # Plain Python floats and lists: a layer's graph has thousands of events over a few dozen
        # active flows, where numpy's per-call overhead would dominate. Every time and byte count is
        # computed with the same float operations, in the same order, as element-wise numpy would.
        n = len(self.kind)
        kind, dur, nbytes, links, succ = self.kind, self.dur, self.nbytes, self.links, self.succ
        start = [nan] * n
        end = [nan] * n
        npred = list(self.npred)
        heap: List[Tuple[float, int]] = []  # (time, task): a delay is done, or a flow (work) starts moving
        push, pop = heapq.heappush, heapq.heappop
        cap = capacity.tolist()
        act: List[int] = []  # active flows (and work): their links, bytes left, rates, 1e-9 x bytes
        act_links: List[tuple] = []
        rem: List[float] = []
        rates: List[float] = []
        tiny: List[float] = []
        thr: List[float] = []  # bytes left at or below which a flow is done (see below)
        groups: Dict[tuple, int] = {}  # links -> active flows on them (they share one rate)
        key = 0  # the sum of hash((links, flows)) over ``groups``: kept as flows come and go
        dirty = False
        # The fair rates are a function of the active flows' links alone, and a pattern of
        # concurrent flows recurs (every ring step, every batch's plans on the same links): computed
        # once each, kept across runs on the same capacities (bounded: a few hundred MB at most),
        # found by ``key`` and checked against the groups they were computed for.
        if _FAIR[0] != cap or len(_FAIR[1]) > _FAIR_MAX:
            _FAIR[:] = [cap, {}]
        fair = _FAIR[1]
        for i in range(n):
            if npred[i] == 0:
                start[i] = 0.0
                push(heap, (dur[i], i))
        t = 0.0
        done = 0
        # No flow moves more than the largest capacity: one whose bytes left exceed what that moves
        # in 2e-12 s cannot end within rounding, whatever its new rate (see the skip below).
        near = 2e-12 * max(cap, default=0.0)
        while heap or act:
            t_new = heap[0][0] if heap else inf
            finished: List[int] = []
            # Another event at this very time: no bytes move (dt = 0), so the pass would only end
            # flows that are within rounding of done at their new rates. None can be when the rates
            # have not changed (the last pass checked them) or when every flow has more than
            # ``near`` left; skip it then (the rates follow at the next time that moves bytes: the
            # same state gives the same rates, so every number stays the same).
            if act and not (t_new == t and (not dirty or min(rem) > near)):
                if dirty:
                    hit = fair.get(key)
                    if hit is not None and hit[0] == groups:
                        share = hit[1]
                    else:
                        share = fair_shares(groups, cap)
                        fair[key] = (dict(groups), share)
                    rates = list(map(share.__getitem__, act_links))
                    # a flow ends when its bytes left are within rounding of 0: relative to its
                    # size (tiny) or to what it moves in 1e-12 s (r <= max(a, b): r <= a or r <= b)
                    thr = [a if a > b else b for a, b in zip(tiny, map(mul, rates, repeat(1e-12)))]
                    dirty = False
                t_flow = t + min(map(truediv, rem, rates))
                if t_flow < t_new:
                    t_new = t_flow
                dt = t_new - t
                rem = list(map(sub, rem, map(mul, rates, repeat(dt))))  # r - q * dt
                keep = list(map(gt, rem, thr))
                if not all(keep):
                    finished = list(compress(act, map(not_, keep)))
                    for i in finished:
                        ls = links[i]
                        c = groups[ls]
                        key -= hash((ls, c))
                        if c == 1:
                            del groups[ls]
                        else:
                            groups[ls] = c - 1
                            key += hash((ls, c - 1))
                    act = list(compress(act, keep))
                    act_links = list(compress(act_links, keep))
                    tiny = list(compress(tiny, keep))
                    rem = list(compress(rem, keep))
                    dirty = True
            t = t_new
            if t > until:
                raise Beyond(t)
            while heap and heap[0][0] <= t:
                i = pop(heap)[1]
                if kind[i] == DELAY:
                    finished.append(i)
                else:
                    ls = links[i]
                    act.append(i)
                    act_links.append(ls)
                    tiny.append(1e-9 * nbytes[i])
                    rem.append(nbytes[i])
                    c = groups.get(ls, 0)
                    if c:
                        key -= hash((ls, c))
                    groups[ls] = c + 1
                    key += hash((ls, c + 1))
                    dirty = True
            done += len(finished)
            for i in finished:
                end[i] = t
                for s in succ[i]:
                    npred[s] -= 1
                    if npred[s] == 0:
                        start[s] = t
                        push(heap, (t + dur[s], s))
        if done != n:
            raise RuntimeError(f"task graph has a cycle or dangling dependency: {n - done} of {n} tasks never ran")
        end_a = np.array(end, dtype=float)
        return RunResult(np.array(start, dtype=float), end_a, float(np.nanmax(end_a)) if n else 0.0)
