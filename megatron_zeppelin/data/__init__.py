"""Workloads: document lengths of global batches (presets, files, Megatron indexed datasets) and the
tokenizers that count a text dataset's tokens."""
