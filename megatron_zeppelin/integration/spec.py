"""get_gpt_layer_zeppelin_spec: megatron-core's GPT layer spec with the Zeppelin pieces swapped in.

The linear modules, norms and MLP stay megatron's own (local spec on CPU, Transformer Engine's on
GPU when it is installed); only two slots change: ``core_attention`` becomes ZeppelinCoreAttention
(the engine, THD layout) and the layer module becomes ZeppelinTransformerLayer (the remap hook).
Parameter names are therefore identical to the stock spec's: checkpoints move between the two.
"""

from __future__ import annotations

import copy

from megatron.core.transformer.spec_utils import ModuleSpec

from .core_attention import ZeppelinCoreAttention
from .layer import ZeppelinTransformerLayer


def _have_te() -> bool:
    try:
        import torch
        import transformer_engine  # noqa: F401
        return torch.cuda.is_available()
    except Exception:
        return False


def get_gpt_layer_zeppelin_spec(normalization: str = "RMSNorm", qk_layernorm: bool = False,
                                use_te: bool = None) -> ModuleSpec:
    """The GPT layer spec for ``--zeppelin-balance`` (dense models; MoE/MLA are not supported)."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    use_te = _have_te() if use_te is None else use_te
    if use_te:
        base = specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=qk_layernorm)
    else:
        base = specs.get_gpt_layer_local_spec(qk_layernorm=qk_layernorm, normalization=normalization)
    spec = copy.deepcopy(base)
    spec.module = ZeppelinTransformerLayer
    spec.submodules.self_attention.submodules.core_attention = ModuleSpec(module=ZeppelinCoreAttention)
    return spec


def get_gpt_layer_reference_spec(normalization: str = "RMSNorm", qk_layernorm: bool = False) -> ModuleSpec:
    """The stock local spec (same parameter names): the single-process oracle in tests."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    return specs.get_gpt_layer_local_spec(qk_layernorm=qk_layernorm, normalization=normalization)
