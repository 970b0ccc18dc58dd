"""ModelSpec: the shapes of a LLaMA-style transformer the cost model needs (megatron_zeppelin/presets/models/*.yaml).

>>> m = ModelSpec(name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256)
>>> m.head_dim, m.kv_bytes_per_token(tp=1)   # K and V, 2 KV heads x 16 dims x 2 bytes each
(16, 128)

An MoE model (``experts`` > 0) replaces every layer's MLP by ``experts`` SwiGLU experts of width
``expert_ffn`` (0 = ``ffn``); each token runs ``top_k`` of them, so its MLP FLOPs are ``top_k``
experts' while its parameters are all experts' plus the router.

>>> e = ModelSpec(name="moe", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, experts=4, top_k=2)
>>> e.matmul_params()["mlp"] - 2 * m.matmul_params()["mlp"]   # 2 experts per token + the router
256
>>> e.mlp_params() == 4 * m.mlp_params() + 64 * 4               # all 4 experts stored
True
"""

from __future__ import annotations

from megatron_zeppelin.errors import ZeppelinError

import os
from dataclasses import asdict, dataclass

from megatron_zeppelin.spec.yaml_load import safe_load
from megatron_zeppelin.presets import preset_dir

MODELS_DIR = preset_dir("models")


class ModelSpecError(ZeppelinError):
    pass


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    head_dim: int = 0  # 0 = hidden // heads
    dtype_bytes: int = 2  # bf16 activations and K/V
    experts: int = 0  # MoE experts per layer (0 = dense MLP)
    top_k: int = 0  # experts each token is routed to (MoE only)
    expert_ffn: int = 0  # width of one expert (0 = ffn)
    router_skew: float = 0.0  # Zipf exponent of sampled expert loads in the cost model (planner/cost/moe_cost.py)

    def __post_init__(self):
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        for f in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "head_dim", "dtype_bytes"):
            if getattr(self, f) < 1:
                raise ModelSpecError(f"model {self.name}: {f} must be >= 1")
        if self.experts:
            if not self.expert_ffn:
                object.__setattr__(self, "expert_ffn", self.ffn)
            if not 1 <= self.top_k <= self.experts:
                raise ModelSpecError(f"model {self.name}: top_k must be in 1..experts ({self.experts})")
        elif self.top_k or self.expert_ffn:
            raise ModelSpecError(f"model {self.name}: top_k / expert_ffn need experts >= 1")
        if self.heads % self.kv_heads:
            raise ModelSpecError(f"model {self.name}: heads ({self.heads}) must be a multiple of kv_heads")

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """Bytes of K and V for one token of one layer on one TP rank."""
        return 2 * max(1, self.kv_heads // tp) * self.head_dim * self.dtype_bytes

    def q_bytes_per_token(self, tp: int = 1) -> int:
        """Bytes of Q (and of the attention output) for one token of one layer on one TP rank."""
        return max(1, self.heads // tp) * self.head_dim * self.dtype_bytes

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def matmul_params(self) -> dict:
        """Weights each token multiplies by in each linear part: ``qkv``, ``out`` (the attention
        projections) and ``mlp`` (SwiGLU; for MoE the ``top_k`` experts a token runs, plus the
        router) per layer, ``head`` (the vocab head) once; the cost model's FLOPs come from here."""
        h, d = self.hidden, self.head_dim
        mlp = 3 * h * self.ffn if not self.is_moe else self.top_k * 3 * h * self.expert_ffn + h * self.experts
        return {"qkv": h * self.heads * d + 2 * h * self.kv_heads * d, "out": self.heads * d * h,
                "mlp": mlp, "head": h * self.vocab}

    def mlp_params(self) -> int:
        """Stored MLP weights of one layer (all experts and the router for MoE)."""
        if not self.is_moe:
            return 3 * self.hidden * self.ffn
        return self.experts * 3 * self.hidden * self.expert_ffn + self.hidden * self.experts

    def linear_flops_per_token(self, tp: int = 1) -> float:
        """Forward matmul FLOPs per token per layer on one TP rank (QKV, out proj, SwiGLU MLP)."""
        p = self.matmul_params()
        return 2.0 * (p["qkv"] + p["out"] + p["mlp"]) / tp

    def head_flops_per_token(self, tp: int = 1) -> float:
        """Forward FLOPs per token of the vocab head (embedding lookup is free)."""
        return 2.0 * self.matmul_params()["head"] / tp

    def params(self) -> int:
        p = self.matmul_params()
        per_layer = p["qkv"] + p["out"] + self.mlp_params() + 2 * self.hidden  # + the two layer norms
        return self.layers * per_layer + 2 * p["head"] + self.hidden  # embedding, head, final norm

    def to_dict(self) -> dict:
        return asdict(self)


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name (``llama-7b``) or a YAML path."""
    path = name_or_path
    if not os.path.exists(path):
        path = os.path.join(MODELS_DIR, f"{name_or_path}.yaml")
    if not os.path.exists(path):
        known = sorted(f[:-5] for f in os.listdir(MODELS_DIR) if f.endswith(".yaml"))
        raise ModelSpecError(f"unknown model '{name_or_path}' (set --model to one of {known} or a YAML path)")
    with open(path) as f:
        d = safe_load(f)
    if not isinstance(d, dict):
        raise ModelSpecError(f"{path}: expected a mapping of model fields")
    try:
        return ModelSpec(**{k: v for k, v in d.items() if k != "source"})
    except TypeError as e:
        raise ModelSpecError(f"{path}: {e}") from None
