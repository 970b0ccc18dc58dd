"""Why ``zeppelin advise`` picked its candidate: each choice against its nearest alternatives, with
their predicted time and memory (what the user would get by choosing differently)."""

from __future__ import annotations

from typing import List

from megatron_zeppelin.spec.megatron_flags import WHY_NO_FSDP_WITH_ZEPPELIN, ZEPPELIN_ZERO_STAGES
from megatron_zeppelin.spec.recompute import ADVISE_LEVELS

G = 2**30


def _alt(best, cands, **change):
    """The candidate equal to ``best`` except for ``change`` (None when not planned)."""
    keys = ("tp", "cp", "strategy", "zero_stage", "recompute", "mbs", "share", "zeppelin_entry")
    want = {k: change.get(k, getattr(best, k)) for k in keys}
    for c in cands:
        if all(getattr(c, k) == v for k, v in want.items()):
            return c
    return None


def _say(c) -> str:
    if c is None:
        return "not plannable"
    return f"{c.iteration_s * 1e3:.0f} ms, {c.memory.total / G:.1f} GiB" + ("" if c.fits else " (does not fit)")


def _shape(c) -> str:
    """What one rank holds per micro-batch: CP size, or the share through the Zeppelin entry."""
    if c.cp > 1:
        return f"CP {c.cp} mbs {c.mbs}"
    return f"share {c.share} mbs {c.mbs}" if c.zeppelin_entry else f"mbs {c.mbs}"


def reasons(best, cands, mem_bytes: float) -> List[str]:
    out = [f"memory per GPU {best.memory.describe()} of {mem_bytes / G:.0f} GiB (activations of "
           f"{best.capacity_tokens} tokens: the fullest rank in one micro-batch)."]
    mbs = "; ".join(f"{_shape(c)}: {_say(c)}" for c in cands if c.tp == best.tp and c.cp == best.cp
                    and c.strategy == best.strategy and c.zero_stage == best.zero_stage
                    and c.recompute == best.recompute and (c.mbs, c.share) != (best.mbs, best.share))
    share = (f"per-rank share {best.share} tokens (--seq-length; --max-position-embeddings the longest "
             f"document), " if best.zeppelin_entry else "")
    out.append(f"{share}micro-batch size {best.mbs}, gradient accumulation {best.ga} (DP {best.dp}; the global "
               f"batch is fixed): " + (mbs or "the only micro-batch size DP divides the global batch's sequences by")
               + ".")
    stages = ZEPPELIN_ZERO_STAGES if best.zeppelin_entry else (0, 1, 2, 3)
    zs = "; ".join(f"ZeRO-{z}: {_say(_alt(best, cands, zero_stage=z))}" for z in stages if z != best.zero_stage)
    out.append(f"ZeRO-{best.zero_stage} ({best.comm_exposed_s * 1e3:.0f} ms of DP communication exposed per step); "
               f"{zs}. The distributed optimizer moves 6 bytes per parameter per step to DDP's 8; ZeRO-2/3 "
               f"reduce (and ZeRO-3 gathers) once per micro-batch."
               + (f" {WHY_NO_FSDP_WITH_ZEPPELIN}." if best.zeppelin_entry else ""))
    rs = "; ".join(f"{lv.granularity}: {_say(_alt(best, cands, recompute=lv))}" for lv in ADVISE_LEVELS if lv != best.recompute)
    out.append(f"recompute {best.recompute.granularity}; {rs}.")
    tps = sorted({c.tp for c in cands})
    ts = "; ".join(f"TP {t}: {_say(min((c for c in cands if c.tp == t and c.fits), key=lambda c: c.iteration_s, default=None))}"
                   for t in tps if t != best.tp)
    out.append(f"TP {best.tp}" + (" with sequence parallelism" if best.sp else "") + f"; best that fits at {ts}.")
    strat = {}
    for c in cands:
        if c.tp == best.tp and c.fits and (c.strategy not in strat or c.iteration_s < strat[c.strategy].iteration_s):
            strat[c.strategy] = c
    ss = ", ".join(f"{s} {_shape(c)} {c.iteration_s * 1e3:.0f} ms" for s, c in strat.items())
    classes = ", ".join(f"{k} {v}" for k, v in sorted(best.classes.items()))
    what = {"packed_dp": ("packed DP without CP: every document on one GPU and balancing gains little"
                          + (" (through the Zeppelin entry, which keeps documents whole beyond the share: "
                             "--zeppelin-strategy packed_dp)" if best.zeppelin_entry else "")),
            "zeppelin": f"Zeppelin (--zeppelin-balance): documents by class in the micro-batch holding the longest: {classes}",
            "static_cp": f"Megatron CP {best.cp} (ring attention over CP groups)",
            "hybrid_dp": "hybrid DP through Zeppelin's engine"}.get(best.strategy, best.strategy)
    out.append(f"{what}; best that fits per strategy at TP {best.tp}: {ss}.")
    missing = [s for s in ("packed_dp", "zeppelin") if not any(c.strategy == s and c.tp == best.tp for c in cands)]
    if missing:
        out.append(f"{', '.join(missing)} at TP {best.tp}: not possible (no per-rank share from the context down "
                   f"to its 1/16 splits the global batch over DP {best.dp * best.cp} ranks, or a document does not "
                   "fit).")
    return out
