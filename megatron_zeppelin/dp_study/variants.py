"""``get_variant``: a data-parallel variant by name. The names, their order and the module and class
of each are base.VARIANTS; this module sits above the variants' modules (which import base), so
building one by name needs no import by string.

>>> [type(get_variant(v)).__name__ for v in VARIANTS]
['SingleProcess', 'NaiveDP', 'BucketedDP', 'TorchDDP', 'McoreDDP', 'McoreDistOpt', 'Zero1', 'Zero2', 'Zero3']
>>> get_variant("zero3").zero_stage, get_variant("naive").loss_scale(4), get_variant("torch_ddp").loss_scale(4)
(3, 1, 4)
"""

from __future__ import annotations

from megatron_zeppelin.dp_study import bucketed, mcore_ddp, naive, torch_ddp, zero
from megatron_zeppelin.dp_study.base import VARIANTS, Variant, VariantError

_MODULES = {m.__name__.rsplit(".", 1)[1]: m for m in (bucketed, mcore_ddp, naive, torch_ddp, zero)}


def get_variant(name: str, **kw) -> Variant:
    if name not in VARIANTS:
        raise VariantError(f"unknown DP variant '{name}' (set --variants to some of {', '.join(VARIANTS)})")
    mod, cls = VARIANTS[name]
    return getattr(_MODULES[mod], cls)(**kw)
