"""The remapping layer: hidden states between the attention layout (balanced for attention) and the
token-balanced linear layout (for the MLP and the vocab head), driven by ``plan.remap``."""

from megatron_zeppelin.remapping.index import RemapIndex, RemapLayoutError, build_index
from megatron_zeppelin.remapping.layer import remap_index, remap_to_attention, remap_to_linear

__all__ = ["remap_to_linear", "remap_to_attention", "remap_index", "build_index", "RemapIndex",
           "RemapLayoutError"]
