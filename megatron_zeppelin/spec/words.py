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
    """How a ring moves K/V: zigzag point-to-point steps, one all-gather (Llama-3), Ulysses
    all-to-alls of Q/K/V and the output (Transformer Engine's ``a2a``: heads split over the ring),
    or both nested (TE's hierarchical ``a2a+p2p``: all-to-all over heads inside groups of
    ``Ring.a2a`` ranks, a zigzag ring of those groups' head-sharded pieces across them)."""
    P2P = "p2p"
    ALLGATHER = "allgather"
    A2A = "a2a"
    A2A_P2P = "a2a+p2p"


class Layout(_Word):
    """A rank's token layout: for attention, or token-balanced for the MLP and the vocab head."""
    ATTENTION = "attention"
    LINEAR = "linear"


class StrategyName(_Word):
    """What makes a plan (planner/strategies.py registers one function per member)."""
    ZEPPELIN = "zeppelin"
    PACKED_DP = "packed_dp"
    STATIC_CP = "static_cp"
    ALLGATHER_CP = "allgather_cp"
    HYBRID_DP = "hybrid_dp"
    DYNAMIC_CP = "dynamic_cp"


class Routing(_Word):
    """``--zeppelin-routing``: split inter-node ring messages over every NIC of a node, or not."""
    AUTO = "auto"  # multi-nic when the domain spans nodes
    MULTI_NIC = "multi-nic"
    OFF = "off"


class Accumulation(_Word):
    """--zeppelin-accumulation: which documents of a global batch go in which micro-batch."""
    DATA_ORDER = "data_order"  # as the data loader reads them: each micro-batch planned on its own
    JOINT = "joint"  # assigned jointly over the micro-batches, each of like work (planner/accumulation.py)
    BY_LENGTH = "by_length"  # assigned jointly, documents of like length together (planner/accumulation.py)
    ROUNDS = "rounds"  # assigned jointly, as Megatron's dynamic-CP scheduler packs rounds (planner/accumulation.py)


class KernelBackend(_Word):
    """``--zeppelin-attention-kernel``: the varlen attention kernel (attention/kernels/select.py)."""
    AUTO = "auto"
    TORCH_FLASH = "torch_flash"
    TE = "te"
    FLASH_ATTN = "flash_attn"
    CPU_FLASH = "cpu_flash"
    REFERENCE = "reference"


class DPVariant(_Word):
    """A data-parallel variant of the DP study (dp_study/), in the order of its tables and plots."""
    SINGLE = "single"
    NAIVE = "naive"
    BUCKETED = "bucketed"
    TORCH_DDP = "torch_ddp"
    MCORE_DDP = "mcore_ddp"
    MCORE_DISTOPT = "mcore_distopt"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"


CLASSES = tuple(DocClass)  # (inter, intra, local): also the one queue order of the attention layer
RING_QUEUES = (DocClass.INTER, DocClass.INTRA)  # the queues that run rings, in that order
STAGES = tuple(Stage)  # routing stages run in this order per step
LINKS = tuple(Link)
COMMS = tuple(Comm)
# A reversed exchange (dK/dV home, a remap's backward) runs each hop the other way round.
MIRROR = {Stage.DIRECT: Stage.DIRECT, Stage.DISPATCH: Stage.COMBINE, Stage.TRANSFER: Stage.TRANSFER,
          Stage.COMBINE: Stage.DISPATCH}
