"""The Zeppelin spec follows the run's model config as Megatron's own GPT builder does, and refuses
by flag what it cannot swap into (runs in the project's .venv: no Megatron-LM training loop)."""

import types

import pytest

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.integration import megatron_lm
from megatron_zeppelin.integration.core_attention import ZeppelinCoreAttention
from megatron_zeppelin.integration.layer import ZeppelinTransformerLayer

pytestmark = pytest.mark.megatron_lm


def config(**kw):
    base = dict(transformer_impl="local", normalization="RMSNorm", qk_layernorm=False, num_moe_experts=None,
                multi_latent_attention=False, experimental_attention_variant=None, qk_l2_norm=False,
                use_kitchen=False, mtp_num_layers=None)
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_spec_is_a_real_module_attribute():
    # Megatron's spec_utils.import_module reads vars(module)[name]
    assert vars(megatron_lm)["zeppelin_layer_spec"] is megatron_lm.zeppelin_layer_spec


def test_spec_follows_qk_layernorm_and_normalization():
    from megatron.core.transformer.identity_op import IdentityOp

    plain = megatron_lm.zeppelin_layer_spec(config())
    qk = megatron_lm.zeppelin_layer_spec(types.SimpleNamespace(transformer=config(qk_layernorm=True,
                                                                                 normalization="LayerNorm")))
    for s in (plain, qk):
        assert s.module is ZeppelinTransformerLayer
        assert s.submodules.self_attention.submodules.core_attention.module is ZeppelinCoreAttention
    assert plain.submodules.self_attention.submodules.q_layernorm is IdentityOp
    assert qk.submodules.self_attention.submodules.q_layernorm is not IdentityOp
    # --normalization: the local norm module reads config.normalization when it is built (RMSNorm
    # or LayerNorm); tests/megatron_lm/test_pretrain.py trains with RMSNorm against the stock spec.


@pytest.mark.parametrize("field,value,flag", [
    ("multi_latent_attention", True, "--multi-latent-attention"),
    ("qk_l2_norm", True, "--qk-l2-norm"), ("mtp_num_layers", 1, "--mtp-num-layers"),
    ("transformer_impl", "inference_optimized", "--transformer-impl")])
def test_spec_refuses_by_flag(field, value, flag):
    with pytest.raises(ZeppelinError, match=flag):
        megatron_lm.zeppelin_layer_spec(config(**{field: value}))


@pytest.mark.moe
def test_moe_spec_keeps_megatron_moe_layer_with_the_zeppelin_slots():
    from megatron.core.transformer.moe.moe_layer import MoELayer

    s = megatron_lm.zeppelin_layer_spec(config(num_moe_experts=4))
    assert s.module is ZeppelinTransformerLayer and s.submodules.mlp.module is MoELayer
    assert s.submodules.self_attention.submodules.core_attention.module is ZeppelinCoreAttention
    for kw, flag in (({"moe_layer_freq": 2}, "--moe-layer-freq"),
                     ({"moe_token_dispatcher_type": "flex"}, "--moe-token-dispatcher-type"),
                     ({"moe_shared_expert_intermediate_size": 64}, "--moe-shared-expert-intermediate-size")):
        with pytest.raises(ZeppelinError, match=flag):
            megatron_lm.zeppelin_layer_spec(config(num_moe_experts=4, **kw))


def test_transformer_engine_without_te_names_the_flag():
    from megatron_zeppelin.integration.spec import _have_te

    if _have_te():
        pytest.skip("Transformer Engine and CUDA are present")
    with pytest.raises(ZeppelinError, match="--transformer-impl local"):
        megatron_lm.zeppelin_layer_spec(config(transformer_impl="transformer_engine"))
