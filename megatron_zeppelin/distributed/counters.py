"""CommCounters: what the runtime actually sent and computed, readable after each engine call.

Bytes are counted by the sender, per link class ('nvlink' inside a node, 'nic' across nodes), per
global NIC id, and per (phase, queue, step) so tests can compare each ring step with the Plan's ops;
compute seconds are per queue ('inter', 'intra', 'local'): wall seconds (``compute_s``) and this
thread's CPU seconds (``compute_cpu_s``: unaffected by other ranks sharing the cores, the honest
compute measure when ranks outnumber CPU cores). These feed the simulator's validation.

>>> c = CommCounters()
>>> c.add_bytes("nic", 3, 64, ("fwd", "inter", 0)); c.add_bytes("nvlink", -1, 16, ("fwd", "intra", 0))
>>> c.bytes_by_link, c.bytes_by_nic, c.total_bytes()
({'nvlink': 16, 'nic': 64}, {3: 64}, 80)
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Dict, Tuple

from megatron_zeppelin.spec.words import DocClass, Link


class CommCounters:
    """Thread-safe: routed exchanges progress on background threads (distributed/executor.py) and
    count their bytes there while the caller's thread times its compute."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def __getstate__(self):  # picklable (ranks send their counters home): the lock stays behind
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def reset(self) -> None:
        self.bytes_by_link: Dict[str, int] = {Link.NVLINK: 0, Link.NIC: 0}
        self.bytes_by_nic: Dict[int, int] = {}
        self.bytes_by_step: Dict[Tuple[str, str, int], int] = {}
        self.rows_by_step: Dict[Tuple[str, str, int], int] = {}
        self.compute_s: Dict[str, float] = {DocClass.INTER: 0.0, DocClass.INTRA: 0.0, DocClass.LOCAL: 0.0}
        self.compute_cpu_s: Dict[str, float] = {DocClass.INTER: 0.0, DocClass.INTRA: 0.0, DocClass.LOCAL: 0.0}
        self.messages = 0

    def add_bytes(self, link: str, nic: int, nbytes: int, step_key: Tuple[str, str, int], rows: int = 0) -> None:
        with self._lock:
            self._add_bytes(link, nic, nbytes, step_key, rows)

    def _add_bytes(self, link, nic, nbytes, step_key, rows) -> None:
        self.bytes_by_link[link] = self.bytes_by_link.get(link, 0) + nbytes
        if link != Link.NVLINK and nic >= 0:  # every network level's hop leaves on a NIC
            self.bytes_by_nic[nic] = self.bytes_by_nic.get(nic, 0) + nbytes
        self.bytes_by_step[step_key] = self.bytes_by_step.get(step_key, 0) + nbytes
        self.rows_by_step[step_key] = self.rows_by_step.get(step_key, 0) + rows
        self.messages += 1

    @contextmanager
    def timer(self, queue: str):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            with self._lock:
                self._add_compute(queue, time.perf_counter() - t0, time.thread_time() - c0)

    def _add_compute(self, queue: str, wall: float, cpu: float) -> None:
        self.compute_s[queue] = self.compute_s.get(queue, 0.0) + wall
        self.compute_cpu_s[queue] = self.compute_cpu_s.get(queue, 0.0) + cpu

    def total_bytes(self) -> int:
        with self._lock:
            return sum(self.bytes_by_link.values())

    def as_dict(self) -> dict:
        with self._lock:
            return {"bytes_by_link": dict(self.bytes_by_link),
                    "bytes_by_nic": {str(k): v for k, v in sorted(self.bytes_by_nic.items())},
                    "bytes_by_step": {f"{p}/{q}/{s}": v for (p, q, s), v in sorted(self.bytes_by_step.items())},
                    "compute_s": dict(self.compute_s), "compute_cpu_s": dict(self.compute_cpu_s), "messages": self.messages}
