"""Leaf types every layer shares: the words (closed sets), the topology, the hardware profile, the
model, activation recompute, the memory model, the run configuration, and token-count parsing.
Presets of the profile, model and dataset types are package data (megatron_zeppelin/presets)."""
