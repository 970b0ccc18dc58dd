"""Which rank caused a failed run, and how: the launcher's diagnosis from exit statuses, the ranks'
own reports and their progress markers.

When one rank dies, its peers fail too, with secondary errors ("Connection reset by peer" when a
peer's sockets close, "Application timeout" when a peer stops answering). The cause, in order:
1. a rank that ended by a signal or a non-zero exit code (the ranks report exceptions themselves and
   exit 0, so this is a kill, ``os._exit`` or a crash), the first one seen;
2. a rank that raised an exception that is not a peer symptom, the first one reported;
3. otherwise a hang: the rank whose progress marker is oldest stopped making progress; its marker
   says where.

>>> peer_symptom("RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1")
True
>>> peer_symptom("ValueError: bad shape")
False
>>> exit_status(-9), exit_status(3)
('killed by signal 9 (SIGKILL)', 'exited with code 3')
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from megatron_zeppelin.distributed.progress import Marker

# what a healthy rank reports when a peer dies or stops: never the cause when another rank is a candidate
_PEER_SYMPTOMS = ("Connection reset by peer", "Connection closed by peer", "Application timeout",
                  "Timed out waiting", "timed out", "Broken pipe", "DistNetworkError", "ECONNRESET",
                  "Socket Timeout", "connection refused", "Connection refused", "Gloo connectFullMesh failed")


def peer_symptom(traceback_text: str) -> bool:
    return any(s in traceback_text for s in _PEER_SYMPTOMS)


def exit_status(code: Optional[int]) -> str:
    """multiprocessing's exitcode in words: negative = the signal that ended it."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        return f"killed by signal {-code} ({name})"
    return f"exited with code {code}"


def _last_line(tb: str) -> str:
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


@dataclass
class Diagnosis:
    rank: int
    kind: str  # "signal", "exit", "exception", "hang"
    exitcode: Optional[int]  # the rank's process exit status as multiprocessing gives it
    headline: str  # one line: the rank, what happened, where
    detail: str = ""  # the rank's traceback, when it sent one
    others: List[str] = field(default_factory=list)  # one line per other rank

    def message(self) -> str:
        parts = [self.headline]
        if self.others:
            parts.append("other ranks (secondary):\n" + "\n".join("  " + o for o in self.others))
        if self.detail:
            parts.append(f"rank {self.rank} traceback:\n{self.detail}")
        return "\n".join(parts)


def diagnose(world: int, pids: List[Optional[int]], exitcodes: Dict[int, int], errors: Dict[int, Tuple[str, str]],
             events: List[Tuple[str, int]], done: set, markers: List[Marker], now: float,
             timed_out: bool = False) -> Diagnosis:
    """``exitcodes``: ranks seen ending non-zero before the launcher stopped anyone; ``errors``: rank ->
    (status, traceback) the ranks reported; ``events``: ("exit" | "error", rank) in the order the
    launcher saw them; ``done``: ranks that returned a result; ``markers``: the progress board."""
    def where(r: int) -> str:
        return markers[r].describe(now) if r < len(markers) else "no marker"

    def pid(r: int) -> str:
        return f" (pid {pids[r]})" if pids[r] else ""

    def others(cause: int) -> List[str]:
        out = []
        for r in range(world):
            if r == cause:
                continue
            if r in errors:
                out.append(f"rank {r}: {_last_line(errors[r][1])}")
            elif r in exitcodes:
                out.append(f"rank {r}: {exit_status(exitcodes[r])}")
            elif r in done:
                out.append(f"rank {r}: finished")
            else:
                out.append(f"rank {r}: stopped by the launcher; {where(r)}")
        return out

    for what, r in events:
        if what == "exit" and r not in errors:  # 1. killed or exited without a report
            code = exitcodes[r]
            kind = "signal" if code < 0 else "exit"
            return Diagnosis(r, kind, code, f"rank {r}{pid(r)} {exit_status(code)}; {where(r)}", others=others(r))
        if what == "error" and not peer_symptom(errors[r][1]):  # 2. an exception of its own
            return Diagnosis(r, "exception", exitcodes.get(r, 0), f"rank {r}{pid(r)} failed: {_last_line(errors[r][1])}",
                             detail=errors[r][1], others=others(r))
    # 3. a hang: prefer ranks that reported nothing (still blocked), then the oldest marker
    silent = [r for r in range(world) if r not in errors and r not in done]
    pool = silent or [r for r in range(world) if r not in done] or list(range(world))
    r = min(pool, key=lambda k: (markers[k].t if k < len(markers) else 0.0, k))
    why = "the launcher's deadline passed" if timed_out and not errors else "its peers timed out waiting"
    return Diagnosis(r, "hang", None, f"rank {r}{pid(r)} stopped making progress ({why}): {where(r)}",
                     others=others(r))
