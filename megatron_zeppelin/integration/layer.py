"""The Zeppelin transformer layer: RoPE positions from the plan, and the remap hook.

attention (attention layout) -> residual add -> REMAP to linear layout -> pre-MLP norm -> MLP ->
residual add -> REMAP back to attention layout (skipped after the last layer, so the final norm,
the vocab head and the loss run in the linear layout). Hidden states are ``[t, 1, hidden]``.

RoPE: in the attention layout row j is not position j of anything (zigzag chunks, several
documents), so the rotary table megatron computed for positions 0..max_seqlen-1 (the batch sets
max_seqlen to the longest document) is indexed by each token's position inside its document and
handed on as ``[t, 1, dim]`` (THD q/k are ``[t, heads, dim]``); megatron then applies it token by
token (no cu_seqlens, so it does not restart positions per segment). The stock GPTModel therefore
runs this spec unchanged (Megatron-LM's ``--spec`` works).

>>> import torch
>>> table = torch.arange(6.0).view(6, 1, 1, 1)        # rotary table for positions 0..5
>>> per_token_freqs(table, torch.tensor([[0, 4, 5, 1]])).flatten().tolist()
[0.0, 4.0, 5.0, 1.0]
"""

from __future__ import annotations

import torch
from megatron.core.transformer.transformer_layer import TransformerLayer

from megatron_zeppelin.errors import ZeppelinError


def per_token_freqs(table: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Rotary table [max_pos, 1, 1, dim] -> this rank's rows [t, 1, dim] (position_ids [1, t])."""
    return table[position_ids.reshape(-1)].squeeze(1)


class ZeppelinTransformerLayer(TransformerLayer):
    def forward(self, *args, **kwargs):
        # The plan of this micro-batch comes with the call (packed_seq_params); keep it for
        # _forward_mlp, which megatron calls without it.
        zp = kwargs.get("packed_seq_params")
        self._zp = zp if getattr(zp, "engine", None) is not None else None
        rope = kwargs.get("rotary_pos_emb")
        if self._zp is not None and rope is not None and not isinstance(rope, tuple):
            if getattr(self.config, "apply_rope_fusion", False):  # fused RoPE wants sbhd, or THD with cu_seqlens
                raise ZeppelinError("--zeppelin-balance needs --no-rope-fusion (per-token RoPE positions of the plan)")
            kwargs["rotary_pos_emb"] = per_token_freqs(rope, self._zp.position_ids)
        try:
            return super().forward(*args, **kwargs)
        finally:
            self._zp = None

    def _forward_mlp(self, hidden_states, *args, **kwargs):
        zp = getattr(self, "_zp", None)
        if zp is None or not zp.remap:
            return super()._forward_mlp(hidden_states, *args, **kwargs)
        # [t_att, 1, h] -> [t_lin, 1, h]
        x = zp.to_linear(hidden_states)
        out = super()._forward_mlp(x, *args, **kwargs)
        if self.layer_number == self.config.num_layers:
            return out  # last layer: stay in the linear layout for norm, head and loss
        # [t_lin, 1, h] -> [t_att, 1, h]. Viewless, as megatron makes its own layer outputs: the
        # remap may hand back a view of its input, and under pipeline parallelism the last layer of
        # a stage gives the schedule its output, whose storage Megatron frees after the send only if
        # it is no view (deallocate_output_tensor asserts so).
        from megatron.core.utils import make_viewless_tensor
        return make_viewless_tensor(inp=zp.to_attention(out), requires_grad=out.requires_grad, keep_graph=True)
