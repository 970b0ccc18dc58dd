"""The tag sequence of one process group on this rank: which message tags a StepExchange uses.

Gloo matches point-to-point messages by (peer, tag), so exchanges that can be in flight together
need tags of their own. A tag is ``(tag * SLOTS + slot) << OP_BITS`` + op index: ``tag``
(0 <= tag < MAX_TAG) separates the exchanges a caller keeps in flight together (the engine's kv,
dkv, gather, scatter), ``slot`` rotates over SLOTS consecutive exchanges of the same tag so that a
relay thread still forwarding pieces of an earlier exchange cannot meet the next one's messages.
Before an exchange posts in a slot, the relay last registered in that slot is joined.

It also keeps each calling thread's *posting chain*: the last exchange of that thread whose sends
are still being posted by a background thread (distributed/executor.py). The next exchange of the
thread posts its sends only after that one has posted all of its own, so a rank's sends on the
group leave in the thread's program order, as NCCL's matching needs (nccl_matching.py), whatever
the relay threads' timing. Chains are per thread: two threads posting on one group keep their own
orders (gloo's tags keep them apart; on NCCL that is not supported at all).

Every rank must take its slots from the same sequence in the same order (the ops come from the
Plan, which all ranks share): an ``ExchangeTags`` therefore lives as long as the group it numbers
(the attention engine owns one per engine and drains it at the end of each pass; a caller keeping
exchanges on one group across engines passes its own) and is passed explicitly: there is no
module-level registry.

>>> tags = ExchangeTags()
>>> [tags.take(0) for _ in range(3)], tags.take(1)
([0, 1, 2], 0)
"""

from __future__ import annotations

import threading
from typing import Dict, Optional, Tuple

SLOTS, OP_BITS = 8, 18  # gloo tags are int32: (tag * SLOTS + slot) < 2**(31 - OP_BITS)
MAX_TAG = 2 ** (31 - OP_BITS) // SLOTS


class ExchangeTags:
    """Slots taken so far per tag, and the exchange whose relay may still run in each slot.
    Thread-safe: exchanges of distinct tags may be created from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq: Dict[int, int] = {}  # tag -> exchanges created so far
        self._live: Dict[Tuple[int, int], object] = {}  # (tag, slot) -> the last exchange with a relay
        self._tail: Dict[int, object] = {}  # thread id -> its last exchange posting from a background thread

    def take(self, tag: int) -> int:
        """The slot of the next exchange of ``tag``."""
        with self._lock:
            seq = self._seq.get(tag, 0)
            self._seq[tag] = seq + 1
        return seq % SLOTS

    def hold(self, tag: int, slot: int, exchange) -> None:
        """``exchange`` runs a relay in (tag, slot): the next exchange there joins it first."""
        with self._lock:
            self._live[(tag, slot)] = exchange

    def release(self, tag: int, slot: int) -> Optional[object]:
        """The exchange whose relay may still run in (tag, slot), forgotten (the caller joins it)."""
        with self._lock:
            return self._live.pop((tag, slot), None)

    def tail(self) -> Optional[object]:
        """The calling thread's last exchange that posts from a background thread (None if none)."""
        with self._lock:
            return self._tail.get(threading.get_ident())

    def follow(self, exchange) -> None:
        """``exchange`` posts from a background thread after the calling thread's current tail."""
        with self._lock:
            self._tail[threading.get_ident()] = exchange

    def drain(self) -> None:
        """Join every relay still running (bounded), re-raising the first error after all are joined."""
        with self._lock:
            live = list(self._live.values())
            self._live.clear()
            self._tail.clear()
        first = None
        for ex in live:
            try:
                ex.join()
            except BaseException as e:  # noqa: BLE001 -- the others are still joined
                first = first or e
        if first is not None:
            raise first
