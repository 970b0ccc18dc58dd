"""Attention: kernels, reference, LSE merge, ring and all-gather context parallelism, the engine."""
