"""Which of a wrong profile's terms a robustness loss comes from: Zeppelin replanned term by term.

A robustness run (sim/perturb.py) plans every strategy with a profile whose terms (attention rates,
GEMM rate, NVLink and NIC bandwidth, and the assumed contention and overheads) are each off by a
seeded factor. Where Zeppelin's plans
are then slower than the best deployed baseline's, the run does not say which factor misled it:
this replans Zeppelin's run with each factor alone (the others true) and with each left out (the
others off), every plan simulated with the true profile as before, beside the same baseline. A term
whose factor alone loses misleads the planner by itself; a term without which Zeppelin no longer
loses is needed for the loss. ``verdict`` says which, in words the report prints.

A loss of the robustness study (a800 llama-7b github 2n 16K/GPU, seed 1, before the assumed terms
were perturbed too; seconds):

>>> alone = {"attention": 6.2283, "gemm": 6.1851, "nvlink": 6.0564, "nic": 6.0564, "contention": 6.0564,
...          "overheads": 6.0564}
>>> left_out = {"attention": 6.1588, "gemm": 6.2283, "nvlink": 6.4780, "nic": 6.4780, "contention": 6.4780,
...             "overheads": 6.4780}
>>> factors = {"attention": 0.82, "gemm": 1.17, "nvlink": 1.13, "nic": 0.88, "contention": 0.99, "overheads": 0.9}
>>> print(verdict(alone, left_out, 6.1925, factors, every_s=6.4780, true_s=6.0564))
nvlink, nic, contention and overheads change nothing (the same plans); attention alone makes Zeppelin 0.6% slower, gemm alone does not; without attention Zeppelin no longer loses; attention and gemm together make it 4.6% slower: the attention rate against the GEMM rate as planned is x0.70 of the true ratio, so the planner weighs a rank's attention against its linear work at the wrong rate
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, List, Optional, Sequence

from megatron_zeppelin.sim.perturb import TERMS

REFERENCE = "zeppelin"


def best_baseline(records: Iterable[Dict], reference: str = REFERENCE) -> Optional[Dict]:
    """The fastest deployed baseline's record among one configuration's (the first of equals): no
    ablation, not ``reference``, and run without error (sim/robustness.py's best too)."""
    from megatron_zeppelin.sim.runs import ABLATIONS
    ok = [r for r in records if r["variant"] != reference and r["variant"] not in ABLATIONS
          and not r.get("error") and r.get("iteration_s")]
    return min(ok, key=lambda r: r["iteration_s"]) if ok else None


def with_loss_terms(spec, records: List[Dict], options=None, cp_sizes: Sequence[int] = ()) -> List[Dict]:
    """``records`` (one configuration's, sim/runs.py ``run_config``), Zeppelin's given ``loss_terms``
    where it ran with a wrong profile and lost to the best deployed baseline: its mean iteration
    replanned with each term's factor ``alone`` and with each ``left_out``, and that baseline."""
    from megatron_zeppelin.sim.runs import run_config
    z = next((r for r in records if r["variant"] == REFERENCE), None)
    if not spec.profile_error or spec.profile_terms or z is None or z.get("error") or not z.get("iteration_s"):
        return records
    best = best_baseline(records)
    if best is None or best["iteration_s"] >= z["iteration_s"]:
        return records

    def mean_s(terms) -> Optional[float]:
        rec = run_config(dataclasses.replace(spec, profile_terms="+".join(terms)), [REFERENCE], options, cp_sizes)[0]
        return rec.get("iteration_s") if not rec.get("error") else None
    z["loss_terms"] = {"alone": {t: mean_s([t]) for t in TERMS},
                       "left_out": {t: mean_s([u for u in TERMS if u != t]) for t in TERMS},
                       "baseline": best["variant"], "baseline_s": best["iteration_s"]}
    return records


def verdict(alone: Dict[str, Optional[float]], left_out: Dict[str, Optional[float]], best_s: float,
            factors: Dict[str, float], every_s: float, true_s: Optional[float] = None) -> str:
    """Which terms the loss comes from, from Zeppelin's mean iterations replanned with each term
    ``alone`` and with each ``left_out``, against the baseline's ``best_s``, beside Zeppelin's with
    every term off (``every_s``, the loss) and with the true profile (``true_s``, where known)."""
    def lose(t):
        return t is not None and t > best_s

    def same(a, b):
        return a is not None and b is not None and abs(a - b) <= 1e-9 * max(abs(b), 1.0)
    inert = [t for t in TERMS if same(left_out.get(t), every_s) and (true_s is None or same(alone.get(t), true_s))]
    active = [t for t in TERMS if t not in inert]
    by_itself = [t for t in active if lose(alone.get(t))]
    quiet = [t for t in active if t not in by_itself and alone.get(t) is not None]
    needed = [t for t in active if left_out.get(t) is not None and not lose(left_out[t])]
    out = [f"{_words(inert)} change{'s' if len(inert) == 1 else ''} nothing (the same plans)"] if inert else []
    alone_words = [f"{t} alone makes Zeppelin {100 * (alone[t] / best_s - 1.0):.1f}% slower" for t in by_itself]
    alone_words += [f"{_words(quiet)} alone {'does' if len(quiet) == 1 else 'do'} not"] if quiet else []
    out.append(", ".join(alone_words) or "no term alone loses")
    if needed:
        out.append(f"without {' or without '.join(needed)} Zeppelin no longer loses")
    else:
        out.append("leaving any one term true, Zeppelin still loses")
    if len(active) > 1:
        together = f"{_words(active)} together make it {100 * (every_s / best_s - 1.0):.1f}% slower"
        if {"attention", "gemm"} <= set(active) and factors.get("gemm"):
            together += (f": the attention rate against the GEMM rate as planned is x"
                         f"{factors['attention'] / factors['gemm']:.2f} of the true ratio, so the planner weighs a "
                         "rank's attention against its linear work at the wrong rate")
        out.append(together)
    return "; ".join(out)


def _words(terms: Sequence[str]) -> str:
    """a; a and b; a, b and c."""
    return terms[0] if len(terms) == 1 else ", ".join(terms[:-1]) + " and " + terms[-1]
