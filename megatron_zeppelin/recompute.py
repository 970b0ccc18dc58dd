"""Activation recompute: one concept, as Megatron's flags set it, used by every part.

``--recompute-granularity`` (unset = none, ``selective`` or ``full``) and, for selective,
``--recompute-modules`` (Megatron's default ``core_attn``). What each part does with it:

- memory (dp/memory.py ``activation_bytes``): what a layer keeps for the backward;
- time (the layer program's backward, priced once: planner/predict.py, simulated by sim/layer.py):
  before a layer's backward, the forward of what it recomputes runs again: ``full`` the whole layer
  (projections, core attention with its ring exchanges, remap all-to-alls, MLP, TP all-reduces);
  ``core_attn`` the core attention's forward right before its backward (a ring-split document repeats
  its K/V ring exchanges; a local document repeats none); ``mlp`` the MLP's forward (and its TP
  all-reduce) before the MLP's backward; ``layernorm`` is elementwise, not in the cost model;
- the runtime (integration/runtime.py ``transformer_config``): megatron-core's own recompute, on the
  Zeppelin spec (``recompute_granularity``, ``recompute_modules``, ``recompute_method``/``num_layers``);
- the planner's config (``ZeppelinConfig.recompute``, from Megatron's flags in integration/args.py):
  plans are predicted with the recompute that runs.

>>> Recompute.parse("selective:mlp,core_attn").describe(), Recompute.parse("full").granularity
('selective:core_attn,mlp', 'full')
>>> Recompute.parse("full").megatron_flags()
['--recompute-granularity', 'full', '--recompute-method', 'uniform', '--recompute-num-layers', '1']
>>> Recompute.from_megatron("selective", ["core_attn"]).describe(), Recompute.from_megatron(None).describe()
('selective:core_attn', 'none')
>>> Recompute.parse("selective:bogus")
Traceback (most recent call last):
...
megatron_zeppelin.recompute.RecomputeError: unknown recompute module 'bogus' (set --recompute-modules to some of core_attn, mlp, layernorm)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from .errors import ZeppelinError


class RecomputeError(ZeppelinError):
    pass


GRANULARITIES = ("none", "selective", "full")  # Megatron's --recompute-granularity (none = flag unset)
# Megatron's --recompute-modules names this model knows (core_attn is Megatron's default module).
MODULES = ("core_attn", "mlp", "layernorm")


@dataclass(frozen=True)
class Recompute:
    """Parsed from "none", "full", "selective" (= core_attn, Megatron's default) or
    "selective:core_attn,mlp,layernorm" (a Recompute, None/False and True = full also parse)."""
    granularity: str = "none"
    modules: tuple = ()

    @classmethod
    def parse(cls, x) -> "Recompute":
        if isinstance(x, Recompute):
            return x
        if x is True:
            return cls("full")
        if x in (None, False, "", "none"):
            return cls()
        gran, _, mods = str(x).partition(":")
        return cls.from_megatron(gran, [m.strip() for m in mods.split(",") if m.strip()])

    @classmethod
    def from_megatron(cls, granularity: Optional[str], modules: Optional[Sequence[str]] = None) -> "Recompute":
        """From megatron's ``recompute_granularity`` / ``recompute_modules`` (args or TransformerConfig)."""
        gran = granularity or "none"
        if gran not in GRANULARITIES:
            raise RecomputeError(f"unknown recompute granularity '{gran}' (set --recompute-granularity to "
                                 f"one of {', '.join(GRANULARITIES)})")
        if gran != "selective":
            return cls(gran)
        names = list(modules or ()) or ["core_attn"]
        for m in names:
            if m not in MODULES:
                raise RecomputeError(f"unknown recompute module '{m}' (set --recompute-modules to some of "
                                     f"{', '.join(MODULES)})")
        return cls("selective", tuple(m for m in MODULES if m in names))

    def has(self, module: str) -> bool:
        """Whether ``module``'s forward runs again in the backward (every module under full)."""
        return self.granularity == "full" or module in self.modules

    @property
    def full(self) -> bool:
        return self.granularity == "full"

    @property
    def none(self) -> bool:
        return self.granularity == "none"

    def describe(self) -> str:
        return self.granularity + (":" + ",".join(self.modules) if self.modules else "")

    def megatron_flags(self) -> list:
        """Megatron-LM's flags (megatron-core requires the method and the layer count with full)."""
        if self.granularity == "selective":
            return ["--recompute-granularity", "selective", "--recompute-modules", *self.modules]
        if self.full:
            return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
        return []

    def transformer_config_kwargs(self) -> dict:
        """The same, as megatron-core TransformerConfig fields."""
        if self.granularity == "selective":
            return dict(recompute_granularity="selective", recompute_modules=list(self.modules))
        if self.full:
            return dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
        return dict(recompute_granularity=None)


# The fastest first: each later choice saves more memory and recomputes more (Megatron users' ladder).
LADDER = ("none", "selective:core_attn", "selective:core_attn,mlp", "selective:core_attn,mlp,layernorm", "full")
# ``zeppelin advise``'s three levels (none, the MLP's selective recompute, full), in its order of preference.
ADVISE_LEVELS = (Recompute(), Recompute("selective", ("mlp",)), Recompute("full"))
