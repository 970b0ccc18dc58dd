"""What memory lets a benchmark configuration hold: the domain a run's GPUs form (TP groups of a
node's GPUs), the tokens per GPU and capacity memory allows, and the recompute a token count needs.
Read by the runs (a strategy's own recompute) and the matrix (a configuration's batch); below both.

>>> from megatron_zeppelin.spec.hardware import load_profile
>>> domain_topology(load_profile("h200"), 2, tp=2).world_size
8
"""

from __future__ import annotations

from typing import Tuple

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.hardware import HardwareProfile, load_profile
from megatron_zeppelin.spec.memory import RECOMPUTE_LADDER, capacity_tokens
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.token_counts import parse_tokens
from megatron_zeppelin.spec.topology import Topology


class MatrixError(ZeppelinError):
    pass


def domain_topology(profile: HardwareProfile, nodes: int, tp: int = 1) -> Topology:
    g = profile.gpus_per_node
    if tp < 1 or g % tp:
        raise ZeppelinError(f"tensor-parallel size {tp} does not divide the {g} GPUs of a {profile.name} node "
                            "(set tp in the matrix or --tp to a divisor)")
    gpus = g // tp
    nics = max(1, min(gpus, profile.nics_per_node // tp))
    wiring = profile.gpu_to_nic if tp == 1 and nics == profile.nics_per_node else ()
    return Topology(nodes, gpus, nics, wiring)


MEMORY_FILL = 0.8  # tokens per GPU / capacity: the slack a balancer needs (packing to 100% rarely fits)


def batch_and_recompute(cluster: str, model: str, tp: int, nodes: int, per_gpu, recompute: str = "auto",
                        fill: float = MEMORY_FILL) -> Tuple[int, int, str]:
    """(tokens per GPU, capacity, recompute) of a configuration, physically realisable: ``per_gpu``
    "memory" fills ``fill`` of what memory holds with ``recompute`` ("auto": no recompute); a token
    count is kept and ``recompute`` "auto" takes the fastest of RECOMPUTE_LADDER whose capacity holds
    it at ``fill``, the capacity then binding every strategy (MatrixError when even full recompute
    cannot). An explicit ``recompute`` with a token count keeps the planner's default capacity only
    when it is "none" and nothing was asked of memory (the compute-bound what-if)."""
    if str(per_gpu) == "memory":
        rc = "none" if recompute == "auto" else recompute
        tok, cap = memory_tokens(cluster, model, tp, nodes, fill, rc)
        return tok, cap, rc
    tok = parse_tokens(per_gpu)
    if recompute != "auto":
        if recompute == "none":
            return tok, 0, "none"
        _, cap = memory_tokens(cluster, model, tp, nodes, fill, recompute)
        return tok, cap, recompute
    for rc in RECOMPUTE_LADDER:
        _, cap = memory_tokens(cluster, model, tp, nodes, fill, rc)
        if tok <= fill * cap:
            return tok, cap, rc
    raise MatrixError(f"{model} (tp {tp}) on {cluster}: {tok} tokens per GPU do not fit in memory even with full "
                      f"recompute (capacity {cap}): lower tokens_per_gpu or raise tp in the matrix")


def memory_tokens(cluster: str, model: str, tp: int, nodes: int, fill: float = MEMORY_FILL,
                  recompute: str = "none") -> Tuple[int, int]:
    """(tokens per GPU, capacity) when memory sets the batch: the capacity is what one GPU holds
    (dp.memory.capacity_tokens: ZeRO-1 over the domain, the given activation recompute, 90% of the
    profile's memory_GB), and the batch fills ``fill`` of it on average. Every strategy must then
    fit the capacity on every rank, as a real run must fit in memory."""
    profile, spec = load_profile(cluster), load_model(model)
    world = domain_topology(profile, nodes, tp).world_size
    cap = capacity_tokens(spec, profile.memory_GB * 1e9, dp=world, tp=tp, zero_stage=1, recompute=recompute)
    if cap < 1:
        raise MatrixError(f"{model} (tp {tp}) does not fit in {profile.memory_GB:g} GB of {cluster} even without "
                          "activations: raise its tp in the matrix")
    return max(1, int(fill * cap)), cap
