"""MoE GPT layers under ``--zeppelin-balance``: megatron-core's MoELayer on the linear layout.

The Zeppelin layer (layer.py) remaps the hidden states to the token-balanced linear layout before
``_forward_mlp`` and back after it; for an MoE model ``self.mlp`` is megatron's own MoELayer
(TopKRouter, MoEAlltoAllTokenDispatcher, SequentialMLP experts), so the router scores and the
experts' dispatch/combine all-to-alls run on the linear layout: every rank routes the same number
of tokens (within one), whatever the documents' lengths. Expert parallelism is Megatron's: the EP
group is a sub-group of the DP ranks (here the Zeppelin domain), ``--expert-model-parallel-size``.

Exactness: a token's expert choice and weights depend on that token only when the router has no
capacity (dropless: ``moe_expert_capacity_factor=None``) and no batch-dependent balancing (the
balancing type ``none``), so the plan's layout cannot change the result: the tests hold it to one
process. Aux losses follow the layout: ``aux_loss`` / ``seq_aux_loss`` balance each rank's own
tokens (as Megatron's do for its own per-rank micro-batches), and ``global_aux_loss``'s gradient
scale under the per-token loss is not yet held to one process (docs/megatron.md).

On CPU (the shim): the local expert MLPs (``SequentialMLP``, no grouped GEMM), no permute fusion;
megatron's alltoall dispatcher creates a ``torch.cuda.Stream`` for device-to-host copies, which
the shim replaces (cpu.py). Without Transformer Engine, megatron-core 0.16.1's router GEMM reads
``te_general_gemm`` that its import fallback never defines (a NameError): ``fill_missing_te_names``
defines the TE names as None, which selects its torch path.
"""

from __future__ import annotations

import copy
import math

from megatron.core.transformer.spec_utils import ModuleSpec

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.model import ModelSpec

BALANCING = ("none", "global_aux_loss", "aux_loss", "seq_aux_loss")


def expert_parallel_size(m: ModelSpec, domain_size: int, requested: int = 0) -> int:
    """EP over the domain's DP ranks: the requested size, or the largest divisor of the domain
    size that also divides the expert count (Megatron needs both).

    >>> m = ModelSpec(name="t", layers=1, hidden=8, heads=2, kv_heads=2, ffn=8, vocab=8, experts=4, top_k=2)
    >>> expert_parallel_size(m, 4), expert_parallel_size(m, 6), expert_parallel_size(m, 2, requested=2)
    (4, 2, 2)
    """
    if not m.experts:
        return 1
    if requested:
        if domain_size % requested or m.experts % requested:
            raise ZeppelinError(f"--expert-model-parallel-size {requested} must divide the data-parallel size "
                                f"{domain_size} and the expert count {m.experts}")
        return requested
    return math.gcd(domain_size, m.experts)


def moe_config_kwargs(m: ModelSpec, ep: int = 1, balancing: str = "none", aux_loss_coeff: float = 0.0) -> dict:
    """TransformerConfig fields of an MoE model (dropless top-k, alltoall dispatcher, EP ``ep``)."""
    if not m.experts:
        return {}
    if balancing not in BALANCING:
        raise ZeppelinError(f"--moe-router-load-balancing-type must be one of {BALANCING}, not {balancing}")
    return dict(num_moe_experts=m.experts, moe_router_topk=m.top_k, moe_ffn_hidden_size=m.expert_ffn,
                moe_token_dispatcher_type="alltoall", moe_router_load_balancing_type=balancing,
                moe_aux_loss_coeff=aux_loss_coeff if balancing != "none" else 0.0,
                moe_expert_capacity_factor=None, moe_grouped_gemm=False, moe_permute_fusion=False,
                moe_router_dtype="fp32", expert_model_parallel_size=ep)


_TE_NAMES = ("te_general_gemm", "fused_compute_score_for_moe_aux_loss", "fused_moe_aux_loss", "fused_permute",
             "fused_permute_with_probs", "fused_sort_chunks_by_index", "fused_sort_chunks_by_index_with_probs",
             "fused_topk_with_score_function", "fused_unpermute")


def fill_missing_te_names() -> None:
    """megatron-core's MoE utils without Transformer Engine: the TE names it tests against None."""
    from megatron.core.transformer.moe import moe_utils

    if not moe_utils.HAVE_TE:
        for name in _TE_NAMES:
            if not hasattr(moe_utils, name):
                setattr(moe_utils, name, None)


def get_gpt_layer_zeppelin_moe_spec(num_experts: int, normalization: str = "RMSNorm",
                                    qk_layernorm: bool = False) -> ModuleSpec:
    """Megatron's local MoE layer spec with the two Zeppelin slots swapped in (same parameter names
    as the stock MoE spec)."""
    from megatron_zeppelin.integration.core_attention import ZeppelinCoreAttention
    from megatron_zeppelin.integration.layer import ZeppelinTransformerLayer

    spec = copy.deepcopy(get_moe_reference_spec(num_experts, normalization, qk_layernorm))
    spec.module = ZeppelinTransformerLayer
    spec.submodules.self_attention.submodules.core_attention = ModuleSpec(module=ZeppelinCoreAttention)
    assert spec.submodules.mlp.module.__name__ == "MoELayer", spec.submodules.mlp
    return spec


def zeppelin_moe_spec_for_config(config) -> ModuleSpec:
    """The Zeppelin MoE layer spec for a megatron TransformerConfig (Megatron-LM's ``--num-experts``):
    the local MoE layer (SequentialMLP experts, or GroupedMLP with ``--moe-grouped-gemm``), every
    layer MoE; settings it has not been checked with are refused by flag."""
    if getattr(config, "transformer_impl", "local") != "local":
        raise ZeppelinError("--zeppelin-balance with --num-experts runs megatron's local MoE layer: "
                            "set --transformer-impl local")
    freq = getattr(config, "moe_layer_freq", 1)
    if freq != 1 and not (isinstance(freq, list) and all(freq)):
        raise ZeppelinError("--zeppelin-balance with --num-experts needs every layer MoE: drop --moe-layer-freq")
    if getattr(config, "moe_token_dispatcher_type", "alltoall") == "flex":
        raise ZeppelinError("--zeppelin-balance runs the alltoall or allgather token dispatcher: "
                            "set --moe-token-dispatcher-type alltoall")
    if getattr(config, "moe_shared_expert_intermediate_size", None):
        raise ZeppelinError("--zeppelin-balance does not support shared experts yet: drop "
                            "--moe-shared-expert-intermediate-size")
    spec = get_gpt_layer_zeppelin_moe_spec(config.num_moe_experts, getattr(config, "normalization", "LayerNorm"),
                                           bool(getattr(config, "qk_layernorm", False)))
    if getattr(config, "moe_grouped_gemm", False):
        from megatron.core.models.gpt import gpt_layer_specs as specs
        grouped = specs.get_gpt_layer_local_spec(num_experts=config.num_moe_experts, moe_grouped_gemm=True)
        spec.submodules.mlp = grouped.submodules.mlp
    return spec


def get_moe_reference_spec(num_experts: int, normalization: str = "RMSNorm", qk_layernorm: bool = False):
    """The stock local MoE spec: the single-process oracle."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    fill_missing_te_names()
    return specs.get_gpt_layer_local_spec(num_experts=num_experts, moe_grouped_gemm=False,
                                          qk_layernorm=qk_layernorm, normalization=normalization)


def global_expert_name(name: str, ep_rank: int, local_experts: int) -> str:
    """``...experts.local_experts.<i>...`` of EP rank r -> the single-process name (expert
    ``r * local_experts + i``); other names unchanged.

    >>> global_expert_name("decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight", 2, 2)
    'decoder.layers.0.mlp.experts.local_experts.5.linear_fc1.weight'
    """
    key = "experts.local_experts."
    if key not in name:
        return name
    head, tail = name.split(key, 1)
    i, rest = tail.split(".", 1)
    return f"{head}{key}{ep_rank * local_experts + int(i)}.{rest}"
