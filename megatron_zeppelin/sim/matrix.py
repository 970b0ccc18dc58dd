"""The benchmark matrix: expand a run YAML into configurations, simulate them, summarise.

A matrix (configs/runs/paper.yaml) has ``studies``; each crosses its ``clusters``, ``models`` (a
name or ``{name, tp}``), ``datasets``, ``context`` lengths and ``nodes``, with the matrix's (or the
study's own) ``strategies``. The summary compares Zeppelin with every other variant on the same
batches: speedup = the variant's simulated iteration / Zeppelin's.

>>> parse_tokens("64K"), parse_tokens(4096)
(65536, 4096)
>>> recs = [{"key": "a", "study": "main", "variant": "zeppelin", "iteration_s": 1.0, "lower_bound_s": 0.9, "error": ""},
...         {"key": "a", "study": "main", "variant": "static_cp", "iteration_s": 3.0, "lower_bound_s": 0.9, "error": ""},
...         {"key": "b", "study": "main", "variant": "zeppelin", "iteration_s": 2.0, "lower_bound_s": 1.0, "error": ""},
...         {"key": "b", "study": "main", "variant": "static_cp", "iteration_s": 1.0, "lower_bound_s": 1.0, "error": ""}]
>>> s = summarize(recs)["summary"]["static_cp"]
>>> s["mean_speedup"], s["max_speedup"], s["losses"]
(1.75, 3.0, ['b'])
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from typing import Dict, List, Sequence, Tuple

import yaml

from ..errors import ZeppelinError
from ..token_counts import parse_tokens  # noqa: F401 - one parser for every command
from .iteration import SimOptions
from .runs import VARIANTS, RunSpec, run_config


class MatrixError(ZeppelinError):
    pass


def load_matrix(path: str) -> Tuple[List[Tuple[RunSpec, Tuple[str, ...]]], dict]:
    """[(spec, variants, cp_sizes)] and the YAML document. ``cp_sizes`` (matrix-wide, or a study's own):
    the CP sizes fixed-CP baselines try (runs.run_config)."""
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except FileNotFoundError:
        raise MatrixError(f"matrix file {path} not found (set --matrix, e.g. configs/runs/paper.yaml)") from None
    except yaml.YAMLError as e:
        raise MatrixError(f"malformed matrix {path}: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("studies"), dict):
        raise MatrixError(f"matrix {path} needs a 'studies' mapping (see configs/runs/paper.yaml)")
    seed = int(doc.get("seed", 0))
    default_vars = tuple(doc.get("strategies", ("zeppelin",)))
    default_cp = tuple(int(x) for x in doc.get("cp_sizes", ()))
    items = []
    for study, st in doc["studies"].items():
        variants = tuple(st.get("strategies", default_vars))
        cps = tuple(int(x) for x in st.get("cp_sizes", default_cp))
        bad = [v for v in variants if v not in VARIANTS]
        if bad:
            raise MatrixError(f"{path}: study {study} names unknown strategies {bad} (known: {', '.join(VARIANTS)})")
        models = [(m, 1) if isinstance(m, str) else (m["name"], int(m.get("tp", 1))) for m in st.get("models", [])]
        try:
            for cl, (model, tp), ds, ctx, nodes in itertools.product(
                    st["clusters"], models, st["datasets"], st["context"], st["nodes"]):
                ctx = parse_tokens(ctx)
                per_gpu, cap = st.get("tokens_per_gpu", doc.get("tokens_per_gpu", ctx)), 0
                if str(per_gpu) == "memory":
                    fill = float(st.get("memory_fill", doc.get("memory_fill", MEMORY_FILL)))
                    per_gpu, cap = memory_tokens(str(cl), model, tp, int(nodes), fill)
                per_gpu = parse_tokens(per_gpu)
                items.append((RunSpec(study, str(cl), model, tp, str(ds), ctx, int(nodes), per_gpu, seed, cap),
                              variants, cps))
        except KeyError as e:
            raise MatrixError(f"{path}: study {study} misses {e} (clusters, models, datasets, context, nodes)") from None
    return items, doc


MEMORY_FILL = 0.8  # tokens per GPU / capacity: the slack a balancer needs (packing to 100% rarely fits)


def memory_tokens(cluster: str, model: str, tp: int, nodes: int, fill: float = MEMORY_FILL) -> Tuple[int, int]:
    """(tokens per GPU, capacity) when memory sets the batch: the capacity is what one GPU holds
    (dp.memory.capacity_tokens: ZeRO-1 over the domain, no activation recompute, 90% of the
    profile's memory_GB), and the batch fills ``fill`` of it on average. Every strategy must then
    fit the capacity on every rank, as a real run must fit in memory."""
    from ..dp.memory import capacity_tokens
    from ..model_spec import load_model
    from ..profile import load_profile
    from .runs import domain_topology
    profile, spec = load_profile(cluster), load_model(model)
    world = domain_topology(profile, nodes, tp).world_size
    cap = capacity_tokens(spec, profile.memory_GB * 1e9, dp=world, tp=tp, zero_stage=1)
    if cap < 1:
        raise MatrixError(f"{model} (tp {tp}) does not fit in {profile.memory_GB:g} GB of {cluster} even without "
                          "activations: raise its tp in the matrix")
    return max(1, int(fill * cap)), cap


def run_matrix(items, options: SimOptions = None, progress: bool = True) -> List[Dict]:
    records: List[Dict] = []
    if not progress:
        for spec, variants, cp_sizes in items:
            records += run_config(spec, variants, options, cp_sizes)
        return records
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
        task = bar.add_task("simulating", total=len(items))
        for spec, variants, cp_sizes in items:
            bar.update(task, description=f"{spec.key()[:60]:<60}")
            records += run_config(spec, variants, options, cp_sizes)
            bar.advance(task)
    return records


def _stats(xs: Sequence[float]) -> Dict[str, float]:
    return {"mean_speedup": sum(xs) / len(xs), "max_speedup": max(xs), "min_speedup": min(xs),
            "geomean_speedup": math.exp(sum(math.log(x) for x in xs) / len(xs)), "configs": len(xs)}


def summarize(records: Sequence[Dict], reference: str = "zeppelin") -> Dict:
    """``summary``: per other variant, Zeppelin's speedup over it on the same batches (mean, max,
    min, geometric mean, and the configurations where Zeppelin is slower: ``losses``).
    ``lower_bound``: Zeppelin's simulated iteration / the lower bound (mean, max)."""
    by_key: Dict[str, Dict[str, Dict]] = defaultdict(dict)
    for r in records:
        if not r.get("error"):
            by_key[r["key"]][r["variant"]] = r
    speed: Dict[str, List[Tuple[str, float]]] = defaultdict(list)
    ceiling: Dict[str, List[float]] = defaultdict(list)  # baseline / lower bound: no strategy beats it by more
    lb = []
    for key, vs in by_key.items():
        z = vs.get(reference)
        if not z:
            continue
        lb.append(z["iteration_s"] / z["lower_bound_s"])
        for v, r in vs.items():
            if v != reference:
                speed[v].append((key, r["iteration_s"] / z["iteration_s"]))
                ceiling[v].append(r["iteration_s"] / z["lower_bound_s"])
    oom: Dict[str, int] = defaultdict(int)  # configurations where only the baseline runs out of memory
    for r in records:
        if "runs out of memory" in (r.get("error") or "") and reference in by_key.get(r["key"], {}):
            oom[r["variant"]] += 1
    summary = {}
    for v, pairs in sorted(speed.items()):
        s = _stats([x for _, x in pairs])
        s["losses"] = [k for k, x in pairs if x < 1.0]
        s["loss_speedups"] = [x for k, x in pairs if x < 1.0]
        s["out_of_memory"] = oom.get(v, 0)
        s["lower_bound_ratio"] = sum(ceiling[v]) / len(ceiling[v])  # the most any strategy could gain, mean
        summary[v] = s
    out = {"summary": summary}
    if lb:
        out["lower_bound"] = {"mean_ratio": sum(lb) / len(lb), "max_ratio": max(lb), "configs": len(lb)}
    out["errors"] = [f"{r['key']} {r['variant']}: {r['error']}" for r in records if r.get("error")]
    return out


def summarize_by_study(records: Sequence[Dict]) -> Dict[str, Dict]:
    studies = sorted({r["study"] for r in records})
    return {s: summarize([r for r in records if r["study"] == s]) for s in studies}
