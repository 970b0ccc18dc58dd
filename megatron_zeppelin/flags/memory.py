"""``--recompute`` for ``plan`` and ``simulate``: the activation recompute plans are priced with, the
per-rank token capacity memory allows, and whether each plan fits a GPU.

A GPU holds its share of the model states (Megatron's distributed optimizer: ZeRO-1 over the domain's
data-parallel ranks, bf16 weights, fp32 gradients and Adam states, divided by TP) and the activations
of the fullest rank of the plan (spec/memory.py, both layouts, the recompute); ``HEADROOM`` (90%) of
the profile's ``memory_GB`` is what may be used. That is the memory model advise and the benchmark
matrix use.

``--recompute auto`` (the default) picks, as the benchmark matrix does (sim/matrix.py
``batch_and_recompute``), the fastest level of spec/recompute.py ``LADDER`` whose capacity holds the
batch's mean tokens per rank at ``MEMORY_FILL`` (0.8: the slack a balancer needs), and binds every
strategy to that capacity (never above the planner's own default of 2x the mean), so the default
setup is one that runs. When even full recompute cannot hold the batch: the default batch (no batch
flag given) shrinks to what memory holds; a batch the user gave is kept, and the output says it does
not fit and which batch would. An explicit level (``none``, ``selective``, ``selective:core_attn,mlp``,
``full``, ``full:block=N``) is priced as given with the planner's default capacity; plans are then
marked where they do not fit.

>>> from megatron_zeppelin.spec.hardware import load_profile
>>> from megatron_zeppelin.spec.model import load_model
>>> from megatron_zeppelin.spec.topology import Topology
>>> a800, l7 = load_profile("a800"), load_model("llama-7b")
>>> m = memory_setup("auto", l7, a800, Topology(4, 8, 4), 1, tokens=1 << 19, batch_given=True)
>>> m.recompute, m.capacity, m.tokens   # 16K per rank need full recompute; 34209 fit, above the default 2 x 16K
('full', 0, 524288)
>>> m = memory_setup("auto", l7, a800, Topology(1, 8, 4), 1, tokens=1 << 17, batch_given=True)
>>> m.recompute, m.capacity            # on 8 ranks the states take more: 25280 tokens fit, binding every strategy
('full', 25280)
>>> m = memory_setup("auto", l7, a800, Topology(1, 8, 4), 1, tokens=1 << 20, batch_given=False)
>>> m.tokens, m.fits_batch             # the default batch shrinks to 0.8 x 25280 per rank
(161792, True)
>>> m = memory_setup("auto", l7, a800, Topology(4, 8, 4), 1, tokens=1 << 20, batch_given=True)
>>> m.recompute, m.capacity, m.tokens, m.fits_batch   # kept as given, said not to fit
('full', 0, 1048576, False)
>>> memory_setup("none", l7, a800, Topology(4, 8, 4), 1, tokens=1 << 19, batch_given=True).capacity
0
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_zeppelin.spec.recompute import LADDER, Recompute

AUTO = "auto"
MEMORY_FILL = 0.8  # mean tokens per rank / capacity (sim/matrix.py uses the same slack)


def add_memory_flags(g) -> None:
    g.add_argument("--recompute", default=AUTO,
                   help="activation recompute the plans are priced with: auto (default: the fastest that lets "
                        "the batch fit the GPU's memory, as advise and the benchmark matrix pick), none, selective"
                        "[:core_attn,mlp,layernorm], full, full:block=N (Megatron's --recompute-* flags)")


@dataclass(frozen=True)
class MemorySetup:
    recompute: str  # Recompute.describe()
    capacity: int  # per-rank token capacity for the planner's config (0 = the planner's default)
    tokens: int  # the batch to plan (the default batch may shrink to what memory holds)
    states_bytes: int  # weights, gradients and optimizer states on one GPU
    limit_bytes: float  # HEADROOM x the profile's memory (0: the profile states none)
    fits_batch: bool  # the batch's mean tokens per rank fit under ``recompute``
    note: str  # one line: what was chosen and why

    def gpu_bytes(self, plan, model, tp: int) -> int:
        """One GPU's predicted peak: the model states plus the plan's fullest rank's activations."""
        from megatron_zeppelin.spec.memory import plan_memory_balance
        return self.states_bytes + plan_memory_balance(plan, model, tp, plan.meta.recompute or None)["max_bytes"]

    def fits(self, plan, model, tp: int) -> bool:
        return not self.limit_bytes or self.gpu_bytes(plan, model, tp) <= self.limit_bytes

    def describe_fit(self, plan, model, tp: int) -> str:
        """``61.2 GB of the 72 GB it may use: fits`` or ``... DOES NOT FIT``."""
        if not self.limit_bytes:
            return "-"
        b = self.gpu_bytes(plan, model, tp)
        return (f"{b / 1e9:.1f} GB of the {self.limit_bytes / 1e9:.0f} GB it may use: "
                + ("fits" if b <= self.limit_bytes else "DOES NOT FIT"))


def memory_setup(level: str, model, profile, topo, tp: int, tokens: int, batch_given: bool,
                 capacity_flag: int = 0) -> MemorySetup:
    """The MemorySetup of ``--recompute level`` for a batch of ``tokens`` over ``topo``'s ranks."""
    from megatron_zeppelin.spec.memory import HEADROOM, capacity_tokens, predict_memory
    world = topo.world_size
    gb = float(getattr(profile, "memory_GB", 0.0) or 0.0)
    limit = HEADROOM * gb * 1e9
    states = predict_memory(model, 0, dp=world, tp=tp, zero_stage=1).total

    def cap(rc) -> int:
        return capacity_tokens(model, gb * 1e9, dp=world, tp=tp, zero_stage=1, recompute=rc) if gb else 1 << 62

    mean = -(-tokens // world) if tokens else 0
    if level != AUTO:
        rc = Recompute.parse(level).describe()
        ok = mean <= cap(rc)
        note = (f"memory: recompute {rc} (--recompute); " +
                (f"{mean} tokens per rank on average fit {gb:g} GB" if ok else
                 f"{mean} tokens per rank on average do not fit {gb:g} GB (at most {cap(rc)}): see memory per GPU"))
        return MemorySetup(rc, capacity_flag, tokens, states, limit if gb else 0.0, ok, note)
    if not tokens:  # a whole file as the batch (--global-batch-tokens 0): its size is known only after loading
        return MemorySetup("none", capacity_flag, tokens, states, limit if gb else 0.0, True,
                           "memory: recompute none (the batch is the whole file: give --recompute to choose)")
    for rc in LADDER:
        c = cap(rc)
        if mean <= MEMORY_FILL * c:
            bound = capacity_flag or (c if c < 2 * mean else 0)
            return MemorySetup(rc, bound, tokens, states, limit if gb else 0.0, True,
                               f"memory: recompute {rc}, the fastest with which {mean} tokens per rank fit "
                               f"{MEMORY_FILL:.0%} of what {gb:g} GB holds ({c} tokens; --recompute auto)")
    c = cap("full")
    most = max(0, int(MEMORY_FILL * c)) * world
    if not batch_given and most > 0:
        return MemorySetup("full", capacity_flag or c, most, states, limit, True,
                           f"memory: the default batch ({tokens} tokens) does not fit {world} ranks of {gb:g} GB "
                           f"even with full recompute: planned {most} tokens, what memory holds at "
                           f"{MEMORY_FILL:.0%} fill (--global-batch-tokens to choose)")
    return MemorySetup("full", capacity_flag, tokens, states, limit, False,
                       f"memory: {tokens} tokens over {world} ranks do not fit {gb:g} GB even with full recompute "
                       f"(a rank holds at most {c} tokens): priced with full recompute; {most} tokens would fit with a "
                       f"balancer's {1 - MEMORY_FILL:.0%} slack (a smaller --global-batch-tokens, more --nodes or a "
                       "larger --tp)")
