"""Norms for Megatron's sequence-parallel regions on the local spec, and the block spec using them.

With ``--sequence-parallel`` a norm sees this TP rank's share of the tokens, so its weight gradient
is a partial sum that must be all-reduced over the TP group (megatron marks such weights
``sequence_parallel``; ``finalize_model_grads`` or ``step.allreduce_sequence_parallel_grads`` sums
them). megatron-core's CPU/no-apex norm (``WrappedTorchNorm``) refuses sequence parallelism only
because it does not set that mark; ``SequenceParallelNorm`` is the same torch norm with the mark,
so the math is the stock spec's (the single-process oracle) exactly. TE and apex norms mark their
weights themselves and are left alone.
"""

from __future__ import annotations

import dataclasses

import torch


class SequenceParallelNorm:
    """``WrappedTorchNorm``'s torch LayerNorm / RMSNorm, weights marked ``sequence_parallel``."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **kwargs):
        norm_cls = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}[config.normalization]
        norm = norm_cls(normalized_shape=hidden_size, eps=eps)
        for p in norm.parameters():
            setattr(p, "sequence_parallel", bool(config.sequence_parallel))
        return norm


def _is_torch_norm(x) -> bool:
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    return x is WrappedTorchNorm or (isinstance(x, ModuleSpec) and x.module is WrappedTorchNorm)


def swap_torch_norms(submodules) -> None:
    """Replace every WrappedTorchNorm in a (nested) submodules dataclass, in place."""
    from megatron.core.transformer.spec_utils import ModuleSpec
    for f in dataclasses.fields(submodules):
        v = getattr(submodules, f.name)
        if _is_torch_norm(v):
            setattr(submodules, f.name, SequenceParallelNorm)
        elif isinstance(v, ModuleSpec) and dataclasses.is_dataclass(v.submodules):
            swap_torch_norms(v.submodules)


def sequence_parallel_block_spec(layer_spec, num_layers: int):
    """A TransformerBlockSubmodules of ``num_layers`` copies of ``layer_spec`` whose final norm is
    sequence-parallel too (megatron picks WrappedTorchNorm for it when apex and TE are absent)."""
    from megatron.core.transformer.transformer_block import LayerNormImpl, TransformerBlockSubmodules
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    final = SequenceParallelNorm if LayerNormImpl is WrappedTorchNorm else LayerNormImpl
    return TransformerBlockSubmodules(layer_specs=[layer_spec] * num_layers, layer_norm=final)
