"""The GPU cost terms of a hardware profile, each of which a study may turn off (issue 53).

A GPU preset prices kernels and messages with terms a plain rate table lacks (docs/simulator.md, "GPU
cost terms"); the study ``gpu_terms`` of presets/runs/paper.yaml runs the same configurations with each
of them off in turn (``gpu_term_off``: one value per run, crossed like the study's other lists), so the
report shows which term moves which speedup. Turning a term off changes the profile both the planner
and the simulator read (the true profile of that run), unlike the robustness study's perturbation.

- ``per_call``: each kernel sequence priced at its keys on its mask's table (``attention.by_sequence``);
  off: each block at its own query rows;
- ``full``: the full-block tables (``attention.full_fwd_tflops`` / ``full_bwd_tflops``);
- ``tile``: below ``attention.tile_tokens`` the rate falls with the keys; off: clamped;
- ``launch``: the launch cost per kernel call (``attention.call_fwd_us`` / ``call_bwd_us``);
- ``message``: the per-message overhead of every hop (``message_us``);
- ``contention``: overlapped NCCL exchanges slow compute (``overlap_slowdown``);
- ``every``: all of them off at once; ``nothing``: the preset as it is.

>>> from megatron_zeppelin.spec.hardware import load_profile
>>> p = load_profile("a800")
>>> without(p, NOTHING) is p, without(p, "message").message_us, without(p, "message").name
(True, 0.0, 'a800-no-message')
>>> q = without(p, "every")
>>> (q.attn_by_sequence, q.attn_full_fwd_tflops, q.attn_tile_tokens, q.overlap_slowdown)
(False, (), 0, 0.0)
>>> without(p, "tiles")
Traceback (most recent call last):
...
megatron_zeppelin.errors.ZeppelinError: gpu_term_off tiles: want one of nothing, per_call, full, tile, launch, message, contention, every
"""

from __future__ import annotations

from dataclasses import replace

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.hardware import HardwareProfile

NOTHING = "nothing"  # every term on: the preset itself
OFF = {
    "per_call": dict(attn_by_sequence=False),
    "full": dict(attn_full_fwd_tflops=(), attn_full_bwd_tflops=()),
    "tile": dict(attn_tile_tokens=0),
    "launch": dict(attn_call_fwd_us=0.0, attn_call_bwd_us=0.0),
    "message": dict(message_us=0.0),
    "contention": dict(overlap_slowdown=0.0),
}
OFF["every"] = {k: v for d in OFF.values() for k, v in d.items()}
TERMS = (NOTHING,) + tuple(OFF)  # the values a study's gpu_term_off may take, in the report's order


def check(term: str) -> str:
    """``term`` if a study may name it, else the error naming the values it may take."""
    if term not in TERMS:
        raise ZeppelinError(f"gpu_term_off {term}: want one of {', '.join(TERMS)}")
    return term


def without(profile: HardwareProfile, term: str) -> HardwareProfile:
    """``profile`` with ``term`` off (itself for ``nothing``)."""
    if check(term) == NOTHING:
        return profile
    return replace(profile, name=f"{profile.name}-no-{term}", **OFF[term])
