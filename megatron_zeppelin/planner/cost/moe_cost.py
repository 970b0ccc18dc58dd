"""MoE terms of the cost model: expert FLOPs under top-k routing, the dispatch/combine
all-to-alls, and expert load imbalance as a router samples it.

An MoE layer on the linear layout (Megatron's alltoall dispatcher, experts spread over EP groups
of consecutive domain ranks, EP = ``expert_parallel_size``) per rank and pass:

1. the router GEMM on the rank's own ``t`` tokens (hidden x experts);
2. **dispatch**: an all-to-all of its ``top_k * t`` routed token copies to the EP ranks holding
   the chosen experts ((EP-1)/EP of them leave the rank; those to another node take a NIC);
3. the experts the rank holds, on the copies routed to them from the whole EP group: their load
   is the group's ``top_k * sum(t)`` copies split by a sampled router (below), and the group waits
   for its busiest rank (the combine cannot finish before its slowest sender);
4. **combine**: the mirror all-to-all back.

The backward repeats the two all-to-alls (mirrored) and doubles the GEMMs. So an MoE rank's time
is NOT a function of its own tokens: the expert part is the EP group's tokens and the router's
luck. Expert load as sampled: ``expert_loads`` draws the group's ``top_k * tokens`` expert picks
as a multinomial over Zipf(s) expert popularities (expert e's weight (e+1)^-s, the order shuffled),
seeded by the token count so a plan stays pure and deterministic. ``s = model.router_skew``: 0 is
a uniform router (only sampling noise), larger values a more skewed one; it is a modelling knob,
not a measured router.

>>> import numpy as np
>>> int(expert_loads(8, 2, 1000, skew=0.0).sum()), expert_loads(8, 2, 1000, skew=0.0).tolist() == expert_loads(8, 2, 1000, skew=0.0).tolist()
(2000, True)
>>> rank_expert_loads(np.array([10, 0, 5, 5]), ep=2).tolist()   # experts 0,1 on EP rank 0; 2,3 on 1
[10, 10]
"""

from __future__ import annotations

import math

import numpy as np

from megatron_zeppelin.spec.words import Link

LINEAR_PASSES = 3.0  # as cost_model: forward + input and weight gradients of a GEMM


def expert_parallel_size(experts: int, domain: int) -> int:
    """Megatron's EP size used for predictions: the largest divisor of the domain that divides the
    expert count (integration/moe.py's default)."""
    return math.gcd(domain, experts) if experts else 1


def expert_loads(experts: int, top_k: int, tokens: int, skew: float = 0.0, seed: int = 0) -> np.ndarray:
    """Routed copies per expert for ``tokens`` tokens: a multinomial sample of ``top_k * tokens``
    picks over Zipf(``skew``) popularities in a shuffled expert order (seeded by ``tokens`` and
    ``seed``)."""
    n = int(top_k * tokens)
    if n <= 0:
        return np.zeros(experts, dtype=np.int64)
    rng = np.random.default_rng([int(tokens), int(seed), experts, top_k])
    w = (np.arange(experts, dtype=np.float64) + 1.0) ** -float(skew)
    p = rng.permutation(w / w.sum())
    return rng.multinomial(n, p)


def rank_expert_loads(loads: np.ndarray, ep: int) -> np.ndarray:
    """Copies each EP rank computes: the sum over the experts it holds (E/EP consecutive ones)."""
    return np.asarray(loads).reshape(ep, -1).sum(axis=1)


def moe_pass_s(cost, t_lin, backward: bool = False, seed: int = 0) -> np.ndarray:
    """Seconds of one MoE layer pass per domain rank (router, dispatch, experts, combine) for the
    linear-layout token counts ``t_lin`` [world]; the backward doubles the GEMMs and repeats the
    all-to-alls. For a dense model it is the SwiGLU MLP's ``gemm_s`` (x2 backward)."""
    m = cost.model
    t = np.asarray(t_lin, dtype=np.float64)
    mult = 2.0 if backward else 1.0
    if not m.is_moe:
        return mult * np.asarray(cost.gemm_s(t, "mlp"), dtype=np.float64)
    topo = cost.topology
    world = topo.world_size
    ep = expert_parallel_size(m.experts, world)
    rate = cost.profile.gemm_tflops * 1e12
    router = mult * t * 2.0 * m.hidden * m.experts / cost.tp / rate
    expert_flops = 2.0 * 3 * m.hidden * m.expert_ffn / cost.tp  # one routed copy through one SwiGLU expert
    out = np.zeros(world)
    for g0 in range(0, world, ep):
        grp = np.arange(g0, g0 + ep)
        loads = rank_expert_loads(expert_loads(m.experts, m.top_k, int(t[grp].sum()), m.router_skew, seed), ep)
        experts_s = mult * float(loads.max()) * expert_flops / rate
        out[grp] = router[grp] + experts_s + 2 * all_to_all_s(cost, t[grp] * m.top_k, grp)
    return out


def all_to_all_s(cost, copies, ranks) -> float:
    """One dispatch (or combine) all-to-all of ``copies[i]`` token copies from each of ``ranks``,
    spread evenly over the group: each rank's share to a rank on its node goes over NVLink, the
    rest over its NIC (the node's NICs shared by its GPUs); the group waits for its slowest rank."""
    topo = cost.topology
    ranks = np.asarray(ranks)
    n = len(ranks)
    if n <= 1:
        return 0.0
    node = ranks // topo.gpus_per_node
    nbytes = np.asarray(copies, dtype=np.float64) * cost.hidden_bytes_per_token
    same = np.array([(node == node[i]).sum() - 1 for i in range(n)], dtype=np.float64)
    nvl = nbytes * same / n
    nic = nbytes * (n - 1 - same) / n
    nic_bw = cost.bandwidth(Link.NIC) * topo.nics_per_node / topo.gpus_per_node
    t = np.where(nvl > 0, cost.latency(Link.NVLINK) + nvl / cost.bandwidth(Link.NVLINK), 0.0) \
        + np.where(nic > 0, cost.latency(Link.NIC) + nic / nic_bw, 0.0)
    return float(t.max())
