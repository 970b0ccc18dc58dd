"""Telling a noisy calibration from a real one, so a busy machine's timings do not silently become a
profile. Load only ever adds time, so the checks look for what load does:

- a length whose repeats disagree (slowest / fastest repeat above ``SPREAD_MAX``);
- a longer document computing at a lower rate than a shorter one's by more than ``DROP_MAX`` (attention
  kernels get *more* efficient with length until they saturate: a drop is a busy moment);
- rates across lengths spanning more than ``RANGE_MAX`` (seen on a busy 2-core machine: 0.13 to 62
  GFLOP/s; a kernel's rate from short to long documents varies a few-fold).

``settle`` measures the suspect lengths again (keeping each length's fastest time over all rounds) and
returns what is still wrong as warnings that name the length and what was noisy.

>>> att = [{"seqlen": 128, "fwd_tflops": 1e-3, "bwd_tflops": 1e-3, "fwd_spread": 1.1, "bwd_spread": 1.1},
...        {"seqlen": 256, "fwd_tflops": 2e-6, "bwd_tflops": 1.2e-3, "fwd_spread": 4.0, "bwd_spread": 1.0}]
>>> suspects(att)
{256: 'forward repeats varied 4.0x; forward rate 0.002 GFLOP/s is below half of L=128 (1 GFLOP/s); forward rates span 500x across lengths'}
>>> suspects([dict(att[0]), dict(att[0], seqlen=256)])
{}
"""

from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

SPREAD_MAX = 2.0
DROP_MAX = 2.0
RANGE_MAX = 50.0
DIRS = (("fwd", "forward"), ("bwd", "backward"))


def _g(tflops: float) -> str:
    return f"{tflops * 1e3:.3g} GFLOP/s"


def suspects(att: Sequence[Dict]) -> Dict[int, str]:
    """{length: what looks wrong} over attention records sorted by length (compute.attention_rates)."""
    out: Dict[int, List[str]] = {}
    rows = sorted(att, key=lambda r: r["seqlen"])
    for d, word in DIRS:
        for r in rows:
            if r.get(f"{d}_spread", 1.0) > SPREAD_MAX:
                out.setdefault(r["seqlen"], []).append(f"{word} repeats varied {r[f'{d}_spread']:.1f}x")
        for j, r in enumerate(rows):
            best = max(rows[:j], key=lambda x: x[f"{d}_tflops"], default=None)
            if best is not None and r[f"{d}_tflops"] * DROP_MAX < best[f"{d}_tflops"]:
                out.setdefault(r["seqlen"], []).append(
                    f"{word} rate {_g(r[f'{d}_tflops'])} is below half of L={best['seqlen']} ({_g(best[f'{d}_tflops'])})")
        rates = [r[f"{d}_tflops"] for r in rows]
        if rates and min(rates) * RANGE_MAX < max(rates):
            slow = min(rows, key=lambda x: x[f"{d}_tflops"])
            out.setdefault(slow["seqlen"], []).append(f"{word} rates span {max(rates) / min(rates):.0f}x across lengths")
    return {L: "; ".join(v) for L, v in sorted(out.items())}


def merge(old: Dict, new: Dict) -> Dict:
    """One length over two rounds: per direction the faster round (its time, rate and spread)."""
    out = dict(old)
    for d, _ in DIRS:
        if new[f"{d}_s"] < old[f"{d}_s"]:
            for k in (f"{d}_s", f"{d}_tflops", f"{d}_spread"):
                out[k] = new[k]
    return out


def settle(att: List[Dict], remeasure: Callable[[List[int]], List[Dict]], retries: int = 2,
           log: Callable[[str], None] = print) -> Tuple[List[Dict], List[str]]:
    """Measure suspect lengths again, up to ``retries`` rounds; returns (records, warnings)."""
    for i in range(retries):
        bad = suspects(att)
        if not bad:
            return att, []
        log(f"[calibrate] noisy attention timings, measuring again (round {i + 2}): "
            + "; ".join(f"L={L}: {why}" for L, why in bad.items()))
        new = {r["seqlen"]: r for r in remeasure(sorted(bad))}
        att = [merge(r, new[r["seqlen"]]) if r["seqlen"] in new else r for r in att]
    return att, [f"attention L={L}: {why}" for L, why in suspects(att).items()]


def gemm_warning(gemm: Dict) -> List[str]:
    s = gemm.get("spread", 1.0)
    return [f"GEMM {gemm.get('shape')}: repeats varied {s:.1f}x"] if s > SPREAD_MAX else []
