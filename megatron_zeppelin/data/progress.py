"""A progress line on stderr for long work (tokenizing a large JSONL): nothing for the first
``after_s`` seconds, then one line at most every ``every_s`` seconds, and a last line when done if
any was printed. Lines, not carriage returns, so logs and pipes read them too.

>>> import io
>>> clock = iter([0.0, 1.0, 3.0, 4.0, 9.0, 10.0]).__next__
>>> out = io.StringIO()
>>> p = Progress("tokenizing x", 100, out=out, clock=clock)
>>> for done in (10, 30, 40, 90):
...     p.update(done, documents=done)
>>> p.finish(100)
>>> print(out.getvalue(), end="")
tokenizing x: 30 bytes / 100 bytes (30%), 30 documents, 3 s
tokenizing x: 90 bytes / 100 bytes (90%), 90 documents, 9 s
tokenizing x: done, 100 bytes in 10 s
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 10 ** 6 else f"{n} bytes"


class Progress:
    def __init__(self, label: str, total_bytes: int, out: Optional[TextIO] = None,
                 clock: Callable[[], float] = time.monotonic, after_s: float = 2.0, every_s: float = 5.0):
        self.label, self.total, self.out, self.clock = label, int(total_bytes), out, clock
        self.after_s, self.every_s = after_s, every_s
        self.t0 = clock()
        self.last: Optional[float] = None

    def _print(self, line: str) -> None:
        print(f"{self.label}: {line}", file=self.out or sys.stderr, flush=True)

    def update(self, done_bytes: int, documents: int) -> None:
        t = self.clock() - self.t0
        if t < self.after_s or (self.last is not None and t - self.last < self.every_s):
            return
        self.last = t
        pct = 100.0 * done_bytes / self.total if self.total else 100.0
        self._print(f"{_size(done_bytes)} / {_size(self.total)} ({pct:.0f}%), {documents} documents, {t:.0f} s")

    def finish(self, done_bytes: int) -> None:
        if self.last is not None:
            self._print(f"done, {_size(done_bytes)} in {self.clock() - self.t0:.0f} s")
