"""Activation recompute: one concept, as Megatron's flags set it, used by every part.

``--recompute-granularity`` (unset = none, ``selective`` or ``full``) and, for selective,
``--recompute-modules`` (Megatron's default ``core_attn``); with full, ``--recompute-method block
--recompute-num-layers N`` recomputes only the first N layers (the others keep everything), written
"full:block=N" (``groups`` splits the layers; ``uniform`` recomputes every layer). What each part
does with it:

- memory (spec/memory.py ``activation_bytes``): what a layer keeps for the backward;
- time (the layer program's backward, priced once: planner/cost/predict.py, simulated by sim/layer.py):
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
>>> b = Recompute.from_megatron("full", method="block", num_layers=4)
>>> b.describe(), [(n, g.describe()) for n, g in b.groups(32)], b.megatron_flags()[-4:]
('full:block=4', [(4, 'full'), (28, 'none')], ['--recompute-method', 'block', '--recompute-num-layers', '4'])
>>> [(n, g.describe()) for n, g in Recompute.parse("full:block=40").groups(32)]  # N >= layers: every layer
[(32, 'full')]
>>> Recompute.parse("selective:bogus")
Traceback (most recent call last):
...
megatron_zeppelin.spec.recompute.RecomputeError: unknown recompute module 'bogus' (set --recompute-modules to some of core_attn, mlp, layernorm)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from megatron_zeppelin.errors import ZeppelinError


class RecomputeError(ZeppelinError):
    pass


GRANULARITIES = ("none", "selective", "full")  # Megatron's --recompute-granularity (none = flag unset)
# Megatron's --recompute-modules names this model knows (core_attn is Megatron's default module).
MODULES = ("core_attn", "mlp", "layernorm")


@dataclass(frozen=True)
class Recompute:
    """Parsed from "none", "full", "full:block=N", "selective" (= core_attn, Megatron's default) or
    "selective:core_attn,mlp,layernorm" (a Recompute, None/False and True = full also parse).
    ``block``: with full, only the first ``block`` layers recompute (0: every layer); such a
    recompute is priced per group of layers (``groups``), never through ``has``/``full``."""
    granularity: str = "none"
    modules: tuple = ()
    block: int = 0

    @classmethod
    def parse(cls, x) -> "Recompute":
        if isinstance(x, Recompute):
            return x
        if x is True:
            return cls("full")
        if x in (None, False, "", "none"):
            return cls()
        gran, _, mods = str(x).partition(":")
        if gran == "full" and mods.startswith("block="):
            try:
                return cls.from_megatron("full", method="block", num_layers=int(mods[len("block="):]))
            except ValueError:
                raise RecomputeError(f"recompute '{x}': block= takes a layer count, e.g. full:block=4") from None
        return cls.from_megatron(gran, [m.strip() for m in mods.split(",") if m.strip()])

    @classmethod
    def from_megatron(cls, granularity: Optional[str], modules: Optional[Sequence[str]] = None,
                      method: Optional[str] = None, num_layers: Optional[int] = None) -> "Recompute":
        """From megatron's ``recompute_granularity`` / ``recompute_modules`` / ``recompute_method`` /
        ``recompute_num_layers`` (args or TransformerConfig)."""
        gran = granularity or "none"
        if gran not in GRANULARITIES:
            raise RecomputeError(f"unknown recompute granularity '{gran}' (set --recompute-granularity to "
                                 f"one of {', '.join(GRANULARITIES)})")
        if gran == "full" and method == "block":
            if not num_layers or int(num_layers) < 1:
                raise RecomputeError("--recompute-method block needs --recompute-num-layers >= 1")
            return cls("full", (), int(num_layers))
        if gran != "selective":
            return cls(gran)
        names = list(modules or ()) or ["core_attn"]
        for m in names:
            if m not in MODULES:
                raise RecomputeError(f"unknown recompute module '{m}' (set --recompute-modules to some of "
                                     f"{', '.join(MODULES)})")
        return cls("selective", tuple(m for m in MODULES if m in names))

    def groups(self, layers: int):
        """[(layer count, the recompute of those layers)]: one group, or for block the first
        ``block`` layers under full recompute and the rest under none."""
        if not self.block:
            return [(layers, self)]
        n = min(self.block, layers)
        return [(n, Recompute("full"))] + ([(layers - n, Recompute())] if n < layers else [])

    def _one(self) -> None:
        if self.block:
            raise RecomputeError(f"recompute {self.describe()} differs per layer: price it per group (groups())")

    def has(self, module: str) -> bool:
        """Whether ``module``'s forward runs again in the backward (every module under full)."""
        self._one()
        return self.granularity == "full" or module in self.modules

    @property
    def full(self) -> bool:
        self._one()
        return self.granularity == "full"

    @property
    def none(self) -> bool:
        return self.granularity == "none"

    def describe(self) -> str:
        if self.block:
            return f"full:block={self.block}"
        return self.granularity + (":" + ",".join(self.modules) if self.modules else "")

    def __str__(self) -> str:  # its text where it is printed or written to JSON
        return self.describe()

    def megatron_flags(self) -> list:
        """Megatron-LM's flags (megatron-core requires the method and the layer count with full)."""
        if self.granularity == "selective":
            return ["--recompute-granularity", "selective", "--recompute-modules", *self.modules]
        if self.granularity == "full":
            method, n = ("block", self.block) if self.block else ("uniform", 1)
            return ["--recompute-granularity", "full", "--recompute-method", method, "--recompute-num-layers", str(n)]
        return []

    def transformer_config_kwargs(self) -> dict:
        """The same, as megatron-core TransformerConfig fields."""
        if self.granularity == "selective":
            return dict(recompute_granularity="selective", recompute_modules=list(self.modules))
        if self.granularity == "full":
            return dict(recompute_granularity="full", recompute_method="block" if self.block else "uniform",
                        recompute_num_layers=self.block or 1)
        return dict(recompute_granularity=None)


# The fastest first: each later choice saves more memory and recomputes more (Megatron users' ladder).
LADDER = ("none", "selective:core_attn", "selective:core_attn,mlp", "selective:core_attn,mlp,layernorm", "full")
# ``zeppelin advise``'s three levels (none, the MLP's selective recompute, full), in its order of preference.
ADVISE_LEVELS = (Recompute(), Recompute("selective", ("mlp",)), Recompute("full"))
