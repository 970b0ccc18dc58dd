"""get_gpt_layer_zeppelin_spec: megatron-core's GPT layer spec with the Zeppelin pieces swapped in.

The linear modules, norms and MLP stay megatron's own (the local spec, or Transformer Engine's with
``--transformer-impl transformer_engine``); only two slots change: ``core_attention`` becomes
ZeppelinCoreAttention (the engine, THD layout) and the layer module becomes ZeppelinTransformerLayer
(the remap hook). Parameter names are therefore identical to the stock spec's: checkpoints move
between the two.

``zeppelin_spec_for_config`` is the spec Megatron's own GPT builder would pick for a
TransformerConfig, with those two slots swapped: it honours what that builder honours for a dense
GPT (``--transformer-impl``, ``--qk-layernorm``, ``--normalization``; ``--swiglu`` and
``--untie-embeddings-and-output-weights`` act through the config and the model) and refuses the
rest by flag name.
"""

from __future__ import annotations

import copy

from megatron.core.transformer.spec_utils import ModuleSpec

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.integration.core_attention import ZeppelinCoreAttention
from megatron_zeppelin.integration.layer import ZeppelinTransformerLayer
from megatron_zeppelin.integration.sp_norm import swap_torch_norms


def _have_te() -> bool:
    try:
        import torch
        import transformer_engine  # noqa: F401
        return torch.cuda.is_available()
    except Exception:
        return False


def get_gpt_layer_zeppelin_spec(normalization: str = "RMSNorm", qk_layernorm: bool = False,
                                use_te: bool = None, sequence_parallel: bool = False) -> ModuleSpec:
    """The GPT layer spec for ``--zeppelin-balance`` (dense models; MoE/MLA are not supported).
    ``sequence_parallel``: the local spec's torch norms become SequenceParallelNorm (sp_norm.py)."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    use_te = _have_te() if use_te is None else use_te
    if use_te:
        base = specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=qk_layernorm)
    else:
        base = specs.get_gpt_layer_local_spec(qk_layernorm=qk_layernorm, normalization=normalization)
    spec = copy.deepcopy(base)
    spec.module = ZeppelinTransformerLayer
    spec.submodules.self_attention.submodules.core_attention = ModuleSpec(module=ZeppelinCoreAttention)
    if sequence_parallel and not use_te:
        swap_torch_norms(spec.submodules)
    return spec


# TransformerConfig fields that make Megatron's GPT builder pick a spec Zeppelin cannot swap into,
# with the flag that set them.
_REFUSED = (
    ("multi_latent_attention", "--multi-latent-attention"),
    ("experimental_attention_variant", "--experimental-attention-variant"),
    ("qk_l2_norm", "--qk-l2-norm"),
    ("use_kitchen", "--kitchen-config-file / --kitchen-recipe-number"),
    ("heterogeneous_block_specs", "--heterogeneous-layers-config-path"),
    ("mtp_num_layers", "--mtp-num-layers"),
)


def zeppelin_spec_for_config(config) -> ModuleSpec:
    """The Zeppelin layer spec matching a megatron TransformerConfig (see the module docstring)."""
    for field, flag in _REFUSED:
        if getattr(config, field, None):
            raise ZeppelinError(f"--zeppelin-balance supports dense GPT layers only: drop {flag}")
    if getattr(config, "num_moe_experts", None):  # megatron's MoE layer on the linear layout (moe.py)
        from megatron_zeppelin.integration.moe import zeppelin_moe_spec_for_config
        return zeppelin_moe_spec_for_config(config)
    impl = getattr(config, "transformer_impl", "local")
    if impl not in ("local", "transformer_engine"):
        raise ZeppelinError(f"--zeppelin-balance supports --transformer-impl local or transformer_engine, not {impl}")
    if impl == "transformer_engine" and not _have_te():
        raise ZeppelinError("--transformer-impl transformer_engine needs Transformer Engine and CUDA: "
                            "install it or set --transformer-impl local")
    return get_gpt_layer_zeppelin_spec(normalization=getattr(config, "normalization", "LayerNorm"),
                                       qk_layernorm=bool(getattr(config, "qk_layernorm", False)),
                                       use_te=impl == "transformer_engine",
                                       sequence_parallel=bool(getattr(config, "sequence_parallel", False)))


def get_gpt_layer_reference_spec(normalization: str = "RMSNorm", qk_layernorm: bool = False) -> ModuleSpec:
    """The stock local spec (same parameter names): the single-process oracle in tests."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    return specs.get_gpt_layer_local_spec(qk_layernorm=qk_layernorm, normalization=normalization)
