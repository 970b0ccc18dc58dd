"""Bring-up of megatron-core for one run: parallel state, seeds, the model, DDP and the optimizer.

Process groups come from megatron's parallel_state here, once, and are passed explicitly from then
on: ``Runtime.domain_group`` (the DP x CP ranks of this TP slice: the Zeppelin domain), ``tp_group``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.model import ModelSpec
from megatron_zeppelin.integration import cpu


class RuntimeSetupError(ZeppelinError):
    pass


@dataclass
class Runtime:
    tp: int
    tp_rank: int
    domain_rank: int
    domain_size: int
    domain_group: Any
    tp_group: Any
    device: torch.device
    cpu_shim: bool
    ep: int = 1  # expert-parallel size (MoE; a sub-group of the domain's DP ranks)
    ep_group: Any = None
    ep_rank: int = 0


def init_parallel(tp: int = 1, seed: int = 1234, ep: int = 1) -> Runtime:
    """torch.distributed must be initialized; sets up megatron's groups (TP x DP, no PP/CP; EP
    ``ep`` over the DP ranks for MoE experts)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    shim = cpu.install()
    if not shim:
        import os
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    world = dist.get_world_size()
    if world % tp:
        raise RuntimeSetupError(f"--tensor-model-parallel-size {tp} does not divide the world size {world}")
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep,
                                 create_gloo_process_groups=not shim)
    tp_rank = ps.get_tensor_model_parallel_rank()
    if shim:
        cpu.seed(seed, tp_rank)
    else:
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
        torch.manual_seed(seed)
        model_parallel_cuda_manual_seed(seed)
    device = torch.device("cpu") if shim else torch.device("cuda", torch.cuda.current_device())
    return Runtime(tp=tp, tp_rank=tp_rank, domain_rank=ps.get_data_parallel_rank(),
                   domain_size=ps.get_data_parallel_world_size(),
                   domain_group=ps.get_data_parallel_group(), tp_group=ps.get_tensor_model_parallel_group(),
                   device=device, cpu_shim=shim, ep=ep, ep_group=ps.get_expert_model_parallel_group(),
                   ep_rank=ps.get_expert_model_parallel_rank())


def transformer_config(m: ModelSpec, tp: int = 1, dtype: torch.dtype = torch.float32, recompute=None,
                       sequence_parallel: bool = False, ep: int = 1, moe_balancing: str = "none",
                       moe_aux_loss_coeff: float = 0.0):
    """``recompute``: megatron-core's own activation recompute (spec/recompute.py: "selective:core_attn",
    "full", ...; True = full), on whichever spec the model is built with; MoE fields from moe.py."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_zeppelin.spec.recompute import Recompute
    from megatron_zeppelin.integration.moe import moe_config_kwargs

    return TransformerConfig(
        num_layers=m.layers, hidden_size=m.hidden, num_attention_heads=m.heads, num_query_groups=m.kv_heads,
        kv_channels=m.head_dim, ffn_hidden_size=m.ffn, normalization="RMSNorm", gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=tp, sequence_parallel=sequence_parallel, use_cpu_initialization=True, calculate_per_token_loss=True,
        params_dtype=dtype, bf16=dtype == torch.bfloat16, init_method_std=0.02,
        bias_dropout_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False, persist_layer_norm=False,
        **Recompute.parse(recompute).transformer_config_kwargs(),
        **moe_config_kwargs(m, ep, moe_balancing, moe_aux_loss_coeff))


def build_model(m: ModelSpec, tp: int = 1, zeppelin: bool = True, max_seq: int = 1 << 16,
                dtype: torch.dtype = torch.float32, device=None, recompute=None, sequence_parallel: bool = False,
                ep: int = 1, moe_balancing: str = "none", moe_aux_loss_coeff: float = 0.0):
    """A GPT model with the Zeppelin spec (or the stock local spec as the oracle), with megatron-core's
    activation ``recompute`` (transformer_config); with ``sequence_parallel`` Megatron's SP regions
    (the Zeppelin spec only); MoE models (``m.experts``) get megatron's MoE layer (moe.py)."""
    from megatron.core.models.gpt import GPTModel

    from megatron_zeppelin.errors import ZeppelinError
    from megatron_zeppelin.integration.moe import get_gpt_layer_zeppelin_moe_spec, get_moe_reference_spec
    from megatron_zeppelin.integration.sp_norm import sequence_parallel_block_spec
    from megatron_zeppelin.integration.spec import get_gpt_layer_reference_spec, get_gpt_layer_zeppelin_spec

    if m.is_moe and sequence_parallel:
        raise ZeppelinError(f"{m.name} is an MoE model: --sequence-parallel with MoE is not supported yet (drop it)")
    config = transformer_config(m, tp, dtype, recompute, sequence_parallel=sequence_parallel, ep=ep,
                                moe_balancing=moe_balancing, moe_aux_loss_coeff=moe_aux_loss_coeff)
    if m.is_moe:
        spec = get_gpt_layer_zeppelin_moe_spec(m.experts) if zeppelin else get_moe_reference_spec(m.experts)
    else:
        spec = (get_gpt_layer_zeppelin_spec(use_te=False if cpu.needed() else None, sequence_parallel=sequence_parallel)
                if zeppelin else get_gpt_layer_reference_spec())
    if sequence_parallel:
        spec = sequence_parallel_block_spec(spec, m.layers)
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=m.vocab, max_sequence_length=max_seq,
                position_embedding_type="rope", share_embeddings_and_output_weights=False,
                pre_process=True, post_process=True)
    return model.to(device or torch.device("cpu"))


def wrap_ddp(model):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               use_distributed_optimizer=False)
    return DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=model)
