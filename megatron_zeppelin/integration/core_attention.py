"""Zeppelin core attention: the attention engine behind megatron-core's core-attention signature.

Sits in the ``core_attention`` slot of SelfAttention. With THD input megatron hands it
``q: [t, heads, head_dim]``, ``k, v: [t, kv_heads, head_dim]`` (this rank's tokens in attention-layout
order, this TP rank's heads; with ``--sequence-parallel`` all of them, after linear_qkv's all-gather,
plus the pad rows that make ``t`` a multiple of TP) and reshapes nothing itself: the output goes back
as ``(t, 1, heads*dim)``.
The engine of the current micro-batch (built once per plan, shared by every layer) travels in
``packed_seq_params`` (a ZeppelinPackedSeqParams), so no global state is read here.
"""

from __future__ import annotations

import math
from typing import Optional

from megatron.core.transformer.module import MegatronModule

from megatron_zeppelin.errors import ZeppelinError


class ZeppelinCoreAttentionError(ZeppelinError):
    pass


class ZeppelinCoreAttention(MegatronModule):
    def __init__(self, config, layer_number: int, attn_mask_type=None, attention_type: str = "self",
                 attention_dropout: Optional[float] = None, softmax_scale: Optional[float] = None,
                 cp_comm_type: Optional[str] = None, pg_collection=None, **kwargs):
        super().__init__(config=config)
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if dropout:
            raise ZeppelinCoreAttentionError(
                f"attention dropout {dropout} is not supported with --zeppelin-balance "
                "(set --attention-dropout 0)")
        if attention_type != "self":
            raise ZeppelinCoreAttentionError("Zeppelin core attention supports self-attention only")
        self.layer_number = layer_number
        kv_channels = config.kv_channels or config.hidden_size // config.num_attention_heads
        self.softmax_scale = softmax_scale or config.softmax_scale or 1.0 / math.sqrt(kv_channels)

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **kwargs):
        engine = getattr(packed_seq_params, "engine", None)
        if engine is None or getattr(packed_seq_params, "qkv_format", None) != "thd":
            raise ZeppelinCoreAttentionError(
                "the Zeppelin layer spec needs the Zeppelin batch (ZeppelinPackedSeqParams from "
                "megatron_zeppelin.integration.batch): drop --zeppelin-balance or use its batch path")
        if attention_bias is not None:
            raise ZeppelinCoreAttentionError("attention bias is not supported with --zeppelin-balance")
        # q: [t, heads, d], k/v: [t, kv_heads, d] -> out [t, heads, d] -> [t, 1, heads*d]
        out = packed_seq_params.attend(query, key, value)
        return out.reshape(out.shape[0], 1, -1)
