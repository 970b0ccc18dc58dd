"""Data-parallel variants compared by ``zeppelin compare-dp`` (one file per variant), the runner
that trains the same tiny GPT with each (the per-GPU memory model is spec/memory.py).

Every variant computes the same math: gradient = sum over ranks of d(local token-loss sum /
domain tokens), the global per-token mean of Megatron's per-token-loss convention.
"""

from __future__ import annotations

from megatron_zeppelin.dp_study.base import Variant, VariantError, VARIANTS
from megatron_zeppelin.dp_study.variants import get_variant

__all__ = ["Variant", "VariantError", "get_variant", "VARIANTS"]
