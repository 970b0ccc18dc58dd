"""The Plan's words: the closed sets its fields take, as string enums.

A Plan's JSON (and its digest) keeps the plain words while code compares and iterates typed
members; a member equals and hashes as its word, so either form works as a dict key. A leaf
module (no imports from the package), so every layer (topology, profile, planner, engine,
simulator, counters) names a link, a class or a stage the same way.

>>> Link.NVLINK == "nvlink", {"local": 1}[DocClass.LOCAL], MIRROR[Stage.DISPATCH]
(True, 1, 'combine')

An attribute of an enum class costs about 0.1 us to look up, against a few ns for a local name:
loops over every document bind the member they compare with to a local first.
"""

from __future__ import annotations

from enum import StrEnum


class _Word(StrEnum):
    def __repr__(self) -> str:  # shown as the word it is in a plan: 'nvlink', not <Link.NVLINK: 'nvlink'>
        return repr(self.value)


class DocClass(_Word):
    """Where a document runs; also the name of the engine's queue that runs it."""
    INTER = "inter"  # a ring spanning nodes
    INTRA = "intra"  # a ring inside one node
    LOCAL = "local"  # whole on one rank


class Stage(_Word):
    """A hop of a message: a direct send, or dispatch -> transfer -> combine when routed."""
    DIRECT = "direct"
    DISPATCH = "dispatch"
    TRANSFER = "transfer"
    COMBINE = "combine"


class Link(_Word):
    """The two link classes every cluster has; a profile may add levels above the NIC's (a spine:
    spec/hardware.py ``levels``), whose names are plain strings in a CommOp's ``link``."""
    NVLINK = "nvlink"  # inside a node
    NIC = "nic"  # across nodes (within the NIC level's group of nodes)


class Comm(_Word):
    """How a ring moves K/V: zigzag point-to-point steps, or one all-gather (Llama-3)."""
    P2P = "p2p"
    ALLGATHER = "allgather"


CLASSES = tuple(DocClass)  # (inter, intra, local): also the one queue order of the attention layer
RING_QUEUES = (DocClass.INTER, DocClass.INTRA)  # the queues that run rings, in that order
STAGES = tuple(Stage)  # routing stages run in this order per step
LINKS = tuple(Link)
COMMS = tuple(Comm)
# A reversed exchange (dK/dV home, a remap's backward) runs each hop the other way round.
MIRROR = {Stage.DIRECT: Stage.DIRECT, Stage.DISPATCH: Stage.COMBINE, Stage.TRANSFER: Stage.TRANSFER,
          Stage.COMBINE: Stage.DISPATCH}
