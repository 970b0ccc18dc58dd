"""A hardware profile off by up to +-e per term, seeded: what a planner sees when its profile is wrong.

The robustness study (presets/runs/paper.yaml ``robustness``) plans every strategy with such a
profile and simulates the plans with the true one: the speedups then show what the planner's
choices are worth when the rates it priced them with are off, as a calibration or a published
figure can be. Four measured terms, each scaled by its own factor drawn uniformly from [1 - e, 1 + e]:
the attention rate tables (forward, backward and full-block, one factor: a kernel is faster or
slower at every length alike), the GEMM rate, NVLink bandwidth, and NIC bandwidth (with every
network level above the NICs). Two terms the GPU presets assume (their ``assumed`` list: no source
gives them) are off by more: each factor uniform in [0, 2], from none to twice the preset
(``ASSUMED``): ``contention``, the SM contention of overlapped NCCL kernels (``overlap_slowdown``),
and ``overheads``, the kernel-call launch and per-message costs (``attention.call_fwd_us``,
``call_bwd_us``, ``message_us``). Link latencies are left as they are.

The factors depend on the seed alone (random.Random(seed): the same on every machine and Python),
so a study's runs are reproducible and the report can name which term moved.

>>> f = factors(0.25, 1)
>>> list(f), all(0.75 <= f[t] <= 1.25 for t in TERMS[:4]), all(0 <= f[t] <= 2 for t in ASSUMED)
(['attention', 'gemm', 'nvlink', 'nic', 'contention', 'overheads'], True, True)
>>> f == factors(0.25, 1), f != factors(0.25, 2), set(factors(0.0, 7).values())
(True, True, {1.0})
>>> from megatron_zeppelin.spec.hardware import load_profile
>>> p = load_profile("a800")
>>> q = perturbed(p, 0.25, 1)
>>> round(q.gemm_tflops / p.gemm_tflops, 12) == round(f["gemm"], 12), q.nic_latency_us == p.nic_latency_us
(True, True)
>>> round(q.overlap_slowdown / p.overlap_slowdown, 12) == round(f["contention"], 12)
True
>>> perturbed(p, 0.0, 3) is p
True
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Dict, Sequence

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.hardware import HardwareProfile

# drawn in this order: a new term goes last, so old seeds keep the factors of the terms before it
TERMS = ("attention", "gemm", "nvlink", "nic", "contention", "overheads")
ASSUMED = ("contention", "overheads")  # the presets' assumed terms: off by a factor in [0, 2] (module doc)


def factors(error: float, seed: int) -> Dict[str, float]:
    """{term: factor} for a relative ``error`` (0.25: each measured term's factor uniform in
    [0.75, 1.25], each assumed one's in [0, 2]; 0: every factor 1) and ``seed``."""
    if not 0.0 <= error < 1.0:
        raise ZeppelinError(f"profile_error {error}: want 0 <= error < 1 (0.25 is +-25%)")
    rng = random.Random(seed)
    return {t: 1.0 + (error if t not in ASSUMED else 1.0 if error else 0.0) * (2.0 * rng.random() - 1.0)
            for t in TERMS}


def perturbed(profile: HardwareProfile, error: float, seed: int, only: Sequence[str] = TERMS) -> HardwareProfile:
    """``profile`` with its rates scaled by ``factors(error, seed)`` (the profile itself at error 0);
    ``only``: the terms scaled, the others left true (which of a seed's factors a loss comes from).

    >>> from megatron_zeppelin.spec.hardware import load_profile
    >>> p, f = load_profile("a800"), factors(0.25, 1)
    >>> q = perturbed(p, 0.25, 1, only=("gemm",))
    >>> q.name, round(q.gemm_tflops / p.gemm_tflops, 12) == round(f["gemm"], 12), q.attn_fwd_tflops == p.attn_fwd_tflops
    ('a800~1:gemm', True, True)
    """
    if error == 0.0:
        return profile
    unknown = set(only) - set(TERMS)
    if unknown:
        raise ZeppelinError(f"unknown profile term(s) {sorted(unknown)}: want some of {', '.join(TERMS)}")
    f = {t: (x if t in only else 1.0) for t, x in factors(error, seed).items()}

    def scale(xs, k):
        return tuple(x * k for x in xs)
    a, o = f["attention"], f["overheads"]
    return replace(profile, name=f"{profile.name}~{seed}" + ("" if set(only) == set(TERMS) else ":" + "+".join(only)),
                   attn_fwd_tflops=scale(profile.attn_fwd_tflops, a), attn_bwd_tflops=scale(profile.attn_bwd_tflops, a),
                   attn_full_fwd_tflops=scale(profile.attn_full_fwd_tflops, a),
                   attn_full_bwd_tflops=scale(profile.attn_full_bwd_tflops, a),
                   gemm_tflops=profile.gemm_tflops * f["gemm"], nvlink_GBps=profile.nvlink_GBps * f["nvlink"],
                   nic_GBps=profile.nic_GBps * f["nic"], overlap_slowdown=profile.overlap_slowdown * f["contention"],
                   attn_call_fwd_us=profile.attn_call_fwd_us * o, attn_call_bwd_us=profile.attn_call_bwd_us * o,
                   message_us=profile.message_us * o,
                   levels=tuple(replace(lv, GBps=lv.GBps * f["nic"]) for lv in profile.levels))
