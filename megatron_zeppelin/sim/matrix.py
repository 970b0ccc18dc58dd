"""The benchmark matrix: expand a run YAML into configurations, simulate them, summarise.

A matrix (megatron_zeppelin/presets/runs/paper.yaml) has ``studies``; each crosses its ``clusters``, ``models`` (a
name or ``{name, tp}``), ``datasets``, ``context`` lengths and ``nodes``, with the matrix's (or the
study's own) ``strategies``. The summary compares Zeppelin with every other variant on the same
runs: speedup = the variant's mean simulated iteration over the run / Zeppelin's, in two columns:
``deployed`` (the baseline's run-level settings fixed for the run, as deployed; sim/runs.py) and
``oracle`` (tuned per batch, with hindsight: an upper bound on the baseline). ``batches`` (matrix-wide
or per study, default 16) sets the run's length; ``recompute`` the activation recompute ("auto": the
fastest that fits, spec/recompute.py LADDER; the same for every strategy; "per_strategy": each
strategy climbs the ladder itself, a run-level setting like its CP size, sim/runs.py).
``global_batch_tokens`` (a token count or a list, which crosses like the others; default none: one
micro-batch per iteration) makes each batch an iteration of Megatron's ``--global-batch-size``:
``micro_batches`` = global_batch_tokens / (tokens_per_gpu x ranks), rounded to the nearest whole
count (at least one), gradient-accumulated (sim/runs.py). ``pipeline`` (stages, or a list that crosses;
default 1) splits ``nodes`` into that many pipeline stages: every micro-batch is planned on one stage's
DP ranks and the iteration runs them in Megatron's 1F1B (sim/iteration.py ``pipeline``).
``gpu_term_off`` (a list that crosses; default ``nothing``) runs the study with one GPU cost term of
its profile off (sim/gpu_terms.py): the report's GPU-terms table.

>>> micro_batches(1 << 20, 4096, 16), micro_batches(4 << 20, 7000, 16), micro_batches(1000, 4096, 16)
(16, 37, 1)

>>> parse_tokens("64K"), parse_tokens(4096)
(65536, 4096)
>>> def rec(key, v, t, oracle=None):
...     return {"key": key, "study": "main", "variant": v, "iteration_s": t, "lower_bound_s": 0.9, "error": "",
...             "oracle_iteration_s": oracle or t, "time_imbalance": 1.0, "memory_imbalance": 1.0}
>>> recs = [rec("a", "zeppelin", 1.0), rec("a", "static_cp", 3.0, 2.0), rec("b", "zeppelin", 2.0), rec("b", "static_cp", 1.0)]
>>> s = summarize(recs)["summary"]
>>> d, o = s["static_cp"]["deployed"], s["static_cp"]["oracle"]
>>> d["mean_speedup"], d["max_speedup"], d["losses"], o["mean_speedup"]
(1.75, 3.0, ['b'], 1.25)
>>> round(s["zeppelin_lower_bound"]["max"], 3)   # 2.0 / 0.9
2.222
>>> recs += [rec("a", "packed_dp", 1.5), rec("b", "packed_dp", 4.0)]
>>> best = summarize(recs)["summary"][BEST]   # per configuration, the fastest deployed baseline
>>> best["deployed"]["mean_speedup"], best["deployed"]["losses"], best["best_of"]
(1.0, ['b'], {'packed_dp': 1, 'static_cp': 1})
>>> no = {**rec("b", "dynamic_cp", None), "error": "not deployable with pipeline stages: ...",
...       "hypothetical_iteration_s": 1.6, "oracle_iteration_s": None}   # sim/runs.py undeployable
>>> s = summarize(recs + [rec("a", "dynamic_cp", 1.2), no])["summary"]
>>> s["dynamic_cp"]["deployed"]["configs"], s["dynamic_cp"]["not_deployable"]["losses"], s[BEST]["best_of"]
(1, ['b'], {'dynamic_cp': 1, 'static_cp': 1})
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import time
from collections import defaultdict
from enum import Enum
from typing import Dict, List, Optional, Sequence, Tuple

import yaml

from megatron_zeppelin.spec.yaml_load import safe_load

from megatron_zeppelin.spec.token_counts import parse_tokens  # noqa: F401 - one parser for every command
from megatron_zeppelin.sim.gpu_terms import NOTHING, check
from megatron_zeppelin.sim.iteration import SimOptions
from megatron_zeppelin.sim.memory_fit import (MEMORY_FILL, MatrixError, batch_and_recompute,  # noqa: F401 -- re-exported
                                             memory_tokens)
from megatron_zeppelin.sim.loss_terms import with_loss_terms
from megatron_zeppelin.sim.runs import DEFAULT_BATCHES, VARIANTS, RunSpec, domain_topology, run_config
from megatron_zeppelin.presets import preset_dir
from megatron_zeppelin.spec.hardware import load_profile


RUNS_DIR = preset_dir("runs")
DEFAULT_MATRIX = os.path.join(RUNS_DIR, "paper.yaml")


def resolve_matrix(path: Optional[str]) -> str:
    """A matrix path as given, else the project's (a bare name like ``paper`` or a path under
    megatron_zeppelin/presets/runs/ is found next to the package, whatever the working directory)."""
    if not path:
        return DEFAULT_MATRIX
    if os.path.exists(path):
        return path
    name = os.path.basename(path)
    for cand in (os.path.join(RUNS_DIR, name), os.path.join(RUNS_DIR, name + ".yaml")):
        if os.path.exists(cand) and (path == name or path.replace(os.sep, "/").endswith("presets/runs/" + name)):
            return cand
    return path


def load_matrix(path: Optional[str] = None) -> Tuple[List[Tuple[RunSpec, Tuple[str, ...]]], dict]:
    """[(spec, variants, cp_sizes)] and the YAML document. ``cp_sizes`` (matrix-wide, or a study's own):
    the CP sizes fixed-CP baselines may deploy (runs.run_config)."""
    path = resolve_matrix(path)
    try:
        with open(path) as f:
            doc = safe_load(f)
    except FileNotFoundError:
        raise MatrixError(f"matrix file {path} not found (set --matrix, e.g. megatron_zeppelin/presets/runs/paper.yaml)") from None
    except yaml.YAMLError as e:
        raise MatrixError(f"malformed matrix {path}: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("studies"), dict):
        raise MatrixError(f"matrix {path} needs a 'studies' mapping (see megatron_zeppelin/presets/runs/paper.yaml)")
    seed = int(doc.get("seed", 0))
    default_vars = tuple(doc.get("strategies", ("zeppelin",)))
    default_cp = tuple(int(x) for x in doc.get("cp_sizes", ()))
    default_batches = int(doc.get("batches", DEFAULT_BATCHES))
    default_rc = str(doc.get("recompute", "auto"))
    items = []
    for study, st in doc["studies"].items():
        variants = tuple(st.get("strategies", default_vars))
        cps = tuple(int(x) for x in st.get("cp_sizes", default_cp))
        batches = int(st.get("batches", default_batches))
        rc_want = str(st.get("recompute", default_rc))
        per_strategy = rc_want == PER_STRATEGY
        rc_want = "auto" if per_strategy else rc_want  # the configuration's own rung sets its batch as before
        balanced = bool(st.get("balance_memory", False))  # Zeppelin with --zeppelin-balance-memory
        if batches < 1:
            raise MatrixError(f"{path}: study {study} has batches {batches}: a run needs at least one batch")
        bad = [v for v in variants if v not in VARIANTS]
        if bad:
            raise MatrixError(f"{path}: study {study} names unknown strategies {bad} (known: {', '.join(VARIANTS)})")
        models = [(m, 1) if isinstance(m, str) else (m["name"], int(m.get("tp", 1))) for m in st.get("models", [])]
        try:
            per_gpus = st.get("tokens_per_gpu", doc.get("tokens_per_gpu", None))
            per_gpus = per_gpus if isinstance(per_gpus, list) else [per_gpus]
            globals_ = st.get("global_batch_tokens", doc.get("global_batch_tokens", None))
            globals_ = [parse_tokens(g) if g is not None else 0
                        for g in (globals_ if isinstance(globals_, list) else [globals_])]
            stages = st.get("pipeline", [1])
            stages = [int(x) for x in (stages if isinstance(stages, list) else [stages])]
            # The robustness study: plan with the profile off by up to +-profile_error per term, one run per
            # seed of profile_seeds (sim/perturb.py); seed 0 of a list means the true profile (the reference).
            err = float(st.get("profile_error", 0.0))
            perturb = [int(x) for x in st.get("profile_seeds", [0])] if err else [0]
            # The GPU-terms study: the same runs with one cost term of the profile off (sim/gpu_terms.py)
            offs = st.get("gpu_term_off", [NOTHING])
            offs = [check(str(x)) for x in (offs if isinstance(offs, list) else [offs])]
            for cl, (model, tp), ds, ctx, nodes, per_gpu, gbs, pp, pseed, off in itertools.product(
                    st["clusters"], models, st["datasets"], st["context"], st["nodes"], per_gpus, globals_, stages,
                    perturb, offs):
                nodes = int(nodes)
                if pp < 1 or nodes % pp:
                    raise MatrixError(f"{path}: study {study} has pipeline {pp} over {nodes} nodes: the stages "
                                      "split the nodes evenly (set pipeline to a divisor of nodes)")
                ctx = parse_tokens(ctx)
                per_gpu = ctx if per_gpu is None else per_gpu
                fill = float(st.get("memory_fill", doc.get("memory_fill", MEMORY_FILL)))
                regime = "memory" if str(per_gpu) == "memory" else "fixed"
                # one stage's DP ranks are the domain; its memory is priced as without stages (each
                # stage holds 1/pp of the model states: conservative), 1F1B keeping pp micro-batches
                # of L/pp layers in flight on the first stage: one micro-batch's activations of L layers
                per_tok, cap, rc = batch_and_recompute(str(cl), model, tp, nodes // pp, per_gpu, rc_want, fill)
                world = domain_topology(load_profile(str(cl)), nodes // pp, tp).world_size
                items.append((RunSpec(study, str(cl), model, tp, str(ds), ctx, nodes, per_tok, seed, cap,
                                      batches, rc, regime, balanced, gbs,
                                      micro_batches(gbs, per_tok, world) if gbs else 1, per_strategy, pp,
                                      profile_error=err if pseed else 0.0, profile_seed=pseed,
                                      gpu_term_off=off),
                              variants, cps))
        except KeyError as e:
            raise MatrixError(f"{path}: study {study} misses {e} (clusters, models, datasets, context, nodes)") from None
    return items, doc


PER_STRATEGY = "per_strategy"  # a study's recompute: each strategy climbs the ladder itself (sim/runs.py)


def micro_batches(global_batch_tokens: int, tokens_per_gpu: int, ranks: int) -> int:
    """Gradient-accumulation steps of one iteration: Megatron's --global-batch-size over
    --micro-batch-size x data-parallel ranks, here in tokens (the nearest whole count, at least one)."""
    return max(1, round(global_batch_tokens / (tokens_per_gpu * ranks)))


class Progress(Enum):
    """How run_matrix shows progress: a live bar (a terminal), a line per finished configuration (a
    log: nohup, a background job, SLURM), or nothing."""
    BAR = "bar"
    LINES = "lines"
    NONE = "none"

    @classmethod
    def for_stream(cls, quiet: bool, stream=None) -> "Progress":
        """NONE when ``quiet`` (--no-progress), else BAR on a terminal and LINES elsewhere."""
        stream = sys.stderr if stream is None else stream
        return cls.NONE if quiet else (cls.BAR if stream.isatty() else cls.LINES)


def run_matrix(items, options: SimOptions = None, progress: Progress = Progress.BAR, stream=None,
               jobs: int = 1) -> List[Dict]:
    """Simulate every configuration of ``items`` (expand's output), ``jobs`` at a time in worker
    processes (each configuration is planned and simulated on its own, deterministically: the
    records are the same, in the same order, whatever ``jobs``); ``progress`` goes to ``stream``
    (default stderr)."""
    out = sys.stderr if stream is None else stream
    done: List[Optional[List[Dict]]] = [None] * len(items)
    t0 = time.perf_counter()
    if progress is Progress.BAR:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.progress import Progress as Bar
        with Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                 TimeRemainingColumn()) as bar:
            task = bar.add_task("simulating", total=len(items))
            for k, recs, _ in _configurations(items, options, jobs):
                done[k] = recs
                bar.update(task, description=f"{items[k][0].key()[:60]:<60}", advance=1)
    else:
        for n, (k, recs, took) in enumerate(_configurations(items, options, jobs), 1):
            done[k] = recs
            if progress is Progress.LINES:
                print(progress_line(n, len(items), items[k][0].key(), took, time.perf_counter() - t0),
                      file=out, flush=True)
    return [r for recs in done for r in recs]


def progress_line(done: int, total: int, key: str, took: float, elapsed: float) -> str:
    """One finished configuration, the time so far and the estimated time left (at the mean pace so far).

    >>> progress_line(3, 12, "main/a800/x", 4.04, 90.0)
    '[3/12] main/a800/x done in 4.0 s; elapsed 1:30, eta 4:30'
    """
    eta = elapsed / done * (total - done) if done else 0.0
    return f"[{done}/{total}] {key} done in {took:.1f} s; elapsed {clock_text(elapsed)}, eta {clock_text(eta)}"


def clock_text(seconds: float) -> str:
    """m:ss, or h:mm:ss from an hour.

    >>> clock_text(59.6), clock_text(3725)
    ('1:00', '1:02:05')
    """
    s = int(round(seconds))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def _one(k: int, spec: RunSpec, variants, options, cp_sizes):
    """A worker's configuration: (its index, its records, seconds); a robustness run Zeppelin loses
    replanned term by term (sim/loss_terms.py)."""
    t = time.perf_counter()
    recs = with_loss_terms(spec, run_config(spec, variants, options, cp_sizes), options, cp_sizes)
    return k, recs, time.perf_counter() - t


def _configurations(items, options, jobs: int):
    """(index, records, seconds) of each configuration as it finishes: in order with one job, else
    from a pool of ``jobs`` worker processes, the configurations of most work submitted first (so the
    longest does not start last)."""
    if jobs <= 1 or len(items) <= 1:
        for k, (spec, variants, cp_sizes) in enumerate(items):
            yield _one(k, spec, variants, options, cp_sizes)
        return
    from concurrent.futures import ProcessPoolExecutor, as_completed
    order = sorted(range(len(items)), key=lambda k: -_work(items[k]))
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(_one, k, items[k][0], items[k][1], options, items[k][2]) for k in order]
        for f in as_completed(futures):
            yield f.result()


def _work(item) -> float:
    """A rough size of a configuration, for the pool's order: tokens planned x strategies."""
    spec, variants, _ = item
    return spec.tokens_per_gpu * spec.nodes * spec.batches * spec.micro_batches * len(variants)


def _stats(pairs: Sequence[Tuple[str, float]]) -> Dict:
    xs = [x for _, x in pairs]
    if not xs:
        return {"mean_speedup": None, "max_speedup": None, "min_speedup": None, "geomean_speedup": None,
                "configs": 0, "losses": [], "loss_speedups": []}
    return {"mean_speedup": sum(xs) / len(xs), "max_speedup": max(xs), "min_speedup": min(xs),
            "geomean_speedup": math.exp(sum(math.log(x) for x in xs) / len(xs)), "configs": len(xs),
            "losses": [k for k, x in pairs if x < 1.0], "loss_speedups": [x for _, x in pairs if x < 1.0]}


BEST = "best_baseline"  # the summary's entry for the fastest deployed baseline of each configuration


def summarize(records: Sequence[Dict], reference: str = "zeppelin") -> Dict:
    """``summary``: per other variant, Zeppelin's speedup over it on the same runs, ``deployed``
    (run-level settings fixed for the run) and ``oracle`` (tuned per batch, with hindsight): mean,
    max, min, geometric mean, configs, and the configurations where Zeppelin is slower (``losses``);
    ``out_of_memory``: runs where no fixed setting of the baseline fits every batch (Zeppelin's does);
    ``lower_bound_ratio``: the deployed baseline / the lower bound (the most any strategy could gain).
    ``summary.best_baseline`` (BEST): the same against, per configuration, the fastest of the
    baselines (strategies, not the ablation steps) as deployed, and the fastest oracle; ``best_of``
    counts which baseline that was.
    ``not_deployable`` (where any): the same over runs the baseline's system refuses (sim/runs.py
    ``undeployable``), simulated as if it ran them, and why; in neither ``deployed`` nor ``oracle``.
    ``summary.zeppelin_lower_bound``: Zeppelin's mean iteration / the lower bound (mean, max).
    ``balance``: per variant (Zeppelin too), the mean over configurations of the plans' time and
    peak-activation-memory imbalance (max / mean over ranks)."""
    by_key: Dict[str, Dict[str, Dict]] = defaultdict(dict)
    for r in records:
        by_key[r["key"]][r["variant"]] = r
    dep: Dict[str, List[Tuple[str, float]]] = defaultdict(list)
    orc: Dict[str, List[Tuple[str, float]]] = defaultdict(list)
    ceiling: Dict[str, List[float]] = defaultdict(list)
    oom: Dict[str, int] = defaultdict(int)
    hyp: Dict[str, List[Tuple[str, float]]] = defaultdict(list)  # not deployable there, simulated as if it were
    why: Dict[str, str] = {}
    lb, zkeys = [], []
    for key, vs in by_key.items():
        z = vs.get(reference)
        if not z or z.get("error") or not z.get("iteration_s"):
            continue
        lb.append(z["iteration_s"] / z["lower_bound_s"])
        zkeys.append(key)
        for v, r in vs.items():
            if v == reference:
                continue
            if not r.get("error") and r.get("iteration_s"):
                dep[v].append((key, r["iteration_s"] / z["iteration_s"]))
                ceiling[v].append(r["iteration_s"] / z["lower_bound_s"])
            elif "out of memory" in (r.get("error") or "") or "fits every batch" in (r.get("error") or ""):
                oom[v] += 1
            elif r.get("hypothetical_iteration_s"):  # sim/runs.py undeployable
                hyp[v].append((key, r["hypothetical_iteration_s"] / z["iteration_s"]))
                why.setdefault(v, r["error"])
            if r.get("oracle_iteration_s"):
                orc[v].append((key, r["oracle_iteration_s"] / z["iteration_s"]))
    summary: Dict[str, Dict] = {}
    for v in sorted(set(dep) | set(orc) | set(oom) | set(hyp)):
        summary[v] = {"deployed": _stats(dep[v]), "oracle": _stats(orc[v]), "out_of_memory": oom.get(v, 0),
                      "lower_bound_ratio": sum(ceiling[v]) / len(ceiling[v]) if ceiling[v] else None}
        if hyp[v]:
            summary[v]["not_deployable"] = {**_stats(hyp[v]), "why": why[v]}
    best = _best_baseline(dep, orc, ceiling, zkeys)
    if best:
        summary[BEST] = best
    if lb:
        summary["zeppelin_lower_bound"] = {"mean": sum(lb) / len(lb), "max": max(lb), "configs": len(lb)}
    balance = {}
    for v in sorted({r["variant"] for r in records}):
        ok = [r for r in records if r["variant"] == v and not r.get("error") and "memory_imbalance" in r]
        if ok:
            balance[v] = {"time_imbalance": sum(r["time_imbalance"] for r in ok) / len(ok),
                          "memory_imbalance": sum(r["memory_imbalance"] for r in ok) / len(ok),
                          "memory_imbalance_max": max(r["memory_imbalance"] for r in ok), "configs": len(ok)}
    return {"summary": summary, "balance": balance, "attribution": attribution(records, reference),
            "errors": [f"{r['key']} {r['variant']}: {r['error']}" for r in records if r.get("error")]}


def attribution(records: Sequence[Dict], reference: str = "zeppelin") -> Dict:
    """``won``: over ``reference``'s runs, how many plans each kind of candidate won (sim/attribution.py;
    a plan per batch, per micro-batch with accumulation); ``plans``: how many were counted."""
    from megatron_zeppelin.sim.attribution import KINDS, count_kinds
    won: Dict[str, int] = defaultdict(int)
    for r in records:
        if r["variant"] == reference and not r.get("error"):
            # counted again from the labels where the run kept them: a file made before a kind was named
            labels = [v for b in r.get("batch_variants", []) for v in (b if isinstance(b, list) else [b])]
            for k, n in (count_kinds(labels) if labels else r.get("won", {})).items():
                won[k] += n
    order = {k: i for i, k in enumerate(KINDS)}
    return {"won": dict(sorted(won.items(), key=lambda kv: (order.get(kv[0], len(KINDS)), kv[0]))),
            "plans": sum(won.values())}


def _best_baseline(dep: Dict[str, List[Tuple[str, float]]], orc: Dict[str, List[Tuple[str, float]]],
                   ceiling: Dict[str, List[float]], keys: Sequence[str]) -> Optional[Dict]:
    """Zeppelin's speedup over the fastest deployed baseline of each configuration (the least speedup
    among the strategies that fit it) and over the fastest oracle; ``out_of_memory``: of ``keys``
    (Zeppelin's runs), those no baseline fits. None without baselines."""
    from megatron_zeppelin.sim.runs import ABLATIONS
    keep = [v for v in dep if v not in ABLATIONS]
    per_key: Dict[str, Tuple[float, str]] = {}
    for v in sorted(keep):
        for key, x in dep[v]:
            if key not in per_key or x < per_key[key][0]:
                per_key[key] = (x, v)
    if not per_key:
        return None
    oracle: Dict[str, float] = {}
    for v in orc:
        if v not in ABLATIONS:
            for key, x in orc[v]:
                oracle[key] = min(x, oracle.get(key, x))
    best_of: Dict[str, int] = defaultdict(int)
    for _, v in per_key.values():
        best_of[v] += 1
    ratio = [ceiling[v][[k for k, _ in dep[v]].index(key)] for key, (_, v) in per_key.items()]
    return {"deployed": _stats([(k, x) for k, (x, _) in per_key.items()]), "oracle": _stats(list(oracle.items())),
            "out_of_memory": sum(k not in per_key for k in keys), "lower_bound_ratio": sum(ratio) / len(ratio),
            "best_of": dict(sorted(best_of.items()))}


def baselines(summary: Dict) -> Dict[str, Dict]:
    """The per-baseline entries of a summary: the strategies and ``best_baseline``, without
    ``zeppelin_lower_bound`` nor Zeppelin's own variants (sim/runs.py ABLATIONS: zeppelin+joint, the
    partitioner alone, no Ulysses, no remap, static_cp+routing), which :func:`ablations` gives.

    >>> s = {"static_cp": 1, BEST: 2, "zeppelin+joint": 3, "zeppelin-noremap": 4, "zeppelin_lower_bound": 5}
    >>> sorted(baselines(s)), sorted(ablations(s))
    (['best_baseline', 'static_cp'], ['zeppelin+joint', 'zeppelin-noremap'])
    """
    from megatron_zeppelin.sim.runs import ABLATIONS
    return {k: v for k, v in summary.items() if k not in ("zeppelin_lower_bound",) + ABLATIONS}


def ablations(summary: Dict) -> Dict[str, Dict]:
    """The entries of a summary for Zeppelin's own variants (sim/runs.py ABLATIONS): Zeppelin's
    speedup over each, what the part it lacks is worth, never counted as a baseline."""
    from megatron_zeppelin.sim.runs import ABLATIONS
    return {k: v for k, v in summary.items() if k in ABLATIONS}


def summarize_by_study(records: Sequence[Dict]) -> Dict[str, Dict]:
    studies = sorted({r["study"] for r in records})
    return {s: summarize([r for r in records if r["study"] == s]) for s in studies}
