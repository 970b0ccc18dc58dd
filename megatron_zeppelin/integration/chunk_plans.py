"""Virtual pipeline stages: one Plan per micro-batch, shared by the model chunks of a rank.

With interleaved 1F1B (``--num-layers-per-virtual-pipeline-stage``) a rank holds several model
chunks, and Megatron runs the forward of micro-batch k once per chunk, each reading k's documents
from the chunk's own data iterator. The Plan is a pure function of the lengths, so one Plan serves
them all: the first chunk takes it (from the plan-ahead worker, the domain's shared broadcast, or
planned in the step) and keeps it here; each later chunk takes it back. Planning it again per chunk
would be as exact but cost the planning (seconds on long batches) once more per chunk, and with
``--zeppelin-plan-sharing`` a broadcast the planning rank pairs with per chunk.

The first chunk always runs micro-batch k's forward before any later chunk of its rank does: chunk
c of stage s takes its input from chunk c of stage s - 1, and chunk c of stage 0 from chunk c - 1
of the last stage, so every later chunk's forward of k waits, through the pipeline, for chunk 0's
forward of k on this very rank. Every chunk reads its iterator in micro-batch order, so a Plan is
kept from chunk 0's forward until the last chunk's forward of the same micro-batch: at most the
micro-batches in flight between them. Plans are kept by their batch's lengths, with a count of the
later chunks still to take them (two micro-batches with the same lengths have the same Plan).

>>> held = ChunkPlans(chunks=2)
>>> held.keep([3, 4], "plan A"); held.keep([5], "plan B"); held.keep([3, 4], "plan A")
>>> len(held), held.take([3, 4]), held.take([5]), held.take([5]), held.take([3, 4]), len(held)
(2, 'plan A', 'plan B', None, 'plan A', 0)
>>> one = ChunkPlans(chunks=1); one.keep([3], "plan"); len(one)   # no later chunk: nothing kept
0
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple


class ChunkPlans:
    """Plans taken by a rank's first model chunk, held for its ``chunks - 1`` later ones."""

    def __init__(self, chunks: int):
        self.later = int(chunks) - 1
        self._held: Dict[Tuple[int, ...], List[Any]] = {}  # lengths -> [plan, later forwards still to take it]

    def keep(self, lengths: Sequence[int], plan) -> None:
        """The first chunk's Plan of a micro-batch, for each later chunk's forward of it."""
        if self.later <= 0:
            return
        entry = self._held.setdefault(tuple(int(x) for x in lengths), [plan, 0])
        entry[1] += self.later

    def take(self, lengths: Sequence[int]) -> Optional[Any]:
        """The Plan the first chunk kept for this micro-batch (None: it kept none)."""
        key = tuple(int(x) for x in lengths)
        entry = self._held.get(key)
        if entry is None:
            return None
        entry[1] -= 1
        if entry[1] == 0:
            del self._held[key]
        return entry[0]

    def __len__(self) -> int:
        return len(self._held)

    def __reduce__(self):
        """Pickled as None: Megatron saves its args (where the run keeps this) in each checkpoint,
        and plans in flight are no state to save."""
        return (_nothing, ())


def _nothing():
    return None
