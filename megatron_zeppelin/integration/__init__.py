"""Megatron-Core integration: the only package that imports megatron.

args (--zeppelin-* flags), spec/layer/core_attention/model (the Zeppelin GPT; moe: its MoE layers), batch (plan ->
per-rank tensors), cpu (the CPU shim), runtime/step/trainer/checkpoint (the training loop), data
(indexed datasets and the embedded corpus).
"""

import warnings

# megatron-core warns at import about optional GPU extras (TE, Apex) absent on CPU machines.
warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine|apex).*")
# TransformerConfig's own default (cuda_graph_scope) trips its deprecation notice on every build.
warnings.filterwarnings("ignore", message="full scope is deprecated")
