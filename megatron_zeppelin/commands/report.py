"""``zeppelin report``: run (or load) the benchmark matrix and write docs/results.md with its figures."""

from __future__ import annotations

import json
import os
import shlex
import time

from megatron_zeppelin.errors import ZeppelinError

# One layer's timeline per regime: 64K tokens per GPU, and the batch memory allows (where TE CP's
# best size spans nodes, as in the paper's Fig. 12).
GANTT_CASES = (dict(name="", cluster="a800", model="llama-7b", dataset="github", context=65536, nodes=2, memory=False,
                    per_gpu="16K"),
               dict(name="_memory", cluster="a800", model="llama-7b", dataset="prolong64k", context=65536, nodes=2,
                    memory=True))



def written_to(command, path: str):
    """``command`` (a recorded ``zeppelin bench`` line) writing its JSON to ``path``, the file the report
    read, and its CSV beside it: a run may have written to a scratch folder before its file was kept
    under results/, and the page must show a command a reader can rerun as is.

    >>> written_to("zeppelin bench --studies memory --json /tmp/m/memory.json --csv /tmp/m/memory.csv",
    ...            "results/bench/memory-1-of-6.json")
    'zeppelin bench --studies memory --json results/bench/memory-1-of-6.json --csv results/bench/memory-1-of-6.csv'
    >>> written_to(None, "x.json") is None
    True
    """
    if not command:
        return command
    words = shlex.split(command)
    for flag, value in (("--json", path), ("--csv", os.path.splitext(path)[0] + ".csv")):
        if flag in words[:-1]:
            words[words.index(flag) + 1] = value
    return shlex.join(words)

def add_parser(subparsers):
    p = subparsers.add_parser(
        "report", help="write docs/results.md: the matrix's tables, figures and the commands that made them",
        description="Run the benchmark matrix on the simulator (or load a `zeppelin bench --json` file) and "
                    "write a Markdown report with the summary, per-study tables, plots and Gantt charts.")
    p.add_argument("--matrix", default=None,
                   help="run matrix (default: the project's megatron_zeppelin/presets/runs/paper.yaml, found from any directory)")
    p.add_argument("--results", metavar="FILE", nargs="+",
                   help="use these `zeppelin bench --json` files (merged) instead of running the matrix")
    p.add_argument("--validation", metavar="FILE", help="validation JSON (`zeppelin bench --validate-cpu --json`) to include")
    p.add_argument("--out", default="docs/results.md", help="report path (default docs/results.md)")
    p.add_argument("--figures", default="docs/figures", help="figure folder (default docs/figures)")
    p.add_argument("--previous", metavar="FILE", default=None,
                   help="the previous report's results.json, whose summary the report quotes beside its own "
                        "(default: the --figures folder's, read before it is replaced)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress (default: a bar on a terminal, else a line per finished configuration)")
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    p.set_defaults(func=run)
    return p


def _gantts(figdir: str, rel: str) -> dict:
    """One layer's timeline of Zeppelin and of TE-style CP (at its best simulated CP size), per case."""
    out = {}
    for c in GANTT_CASES:
        out.update(_gantt_case(c, figdir, rel))
    return out


def _gantt_case(c: dict, figdir: str, rel: str) -> dict:
    from megatron_zeppelin.spec.config import ZeppelinConfig
    from megatron_zeppelin.spec.model import load_model
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.sim.iteration import simulate
    from megatron_zeppelin.sim.matrix import batch_and_recompute, memory_tokens
    from megatron_zeppelin.plots.matrix import gantt
    from megatron_zeppelin.sim.runs import domain_topology, make_plan
    from megatron_zeppelin.data.workloads import sample_batch
    profile, model = load_profile(c["cluster"]), load_model(c["model"])
    topo = domain_topology(profile, c["nodes"])
    per_gpu, cap = memory_tokens(c["cluster"], c["model"], 1, c["nodes"]) if c["memory"] else \
        batch_and_recompute(c["cluster"], c["model"], 1, c["nodes"], c["per_gpu"])[:2]
    lengths = [int(x) for x in sample_batch(c["dataset"], per_gpu * topo.world_size, 0, max_len=c["context"])]
    cfg = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node, gpu_nic_map=topo.gpu_to_nic,
                         capacity_tokens=cap)
    out = {}
    for v in ("zeppelin", "static_cp"):
        best = None
        for cp in ((0,) if v == "zeppelin" else (2, 4, 8, 16)):
            try:
                plan = make_plan(v, lengths, topo, profile, model, cfg.with_(cp_size=cp))
            except ZeppelinError:
                continue  # this CP size does not fit the capacity
            res = simulate(plan, profile, model)
            if best is None or res.iteration_s < best[1].iteration_s:
                best = (cp, res)
        name = f"gantt_{v}{c['name']}"
        cp = f", CP {best[0]}" if best[0] else ""
        batch = f"{per_gpu} tokens/GPU (memory)" if c["memory"] else f"{per_gpu // 1024}K tokens/GPU"
        gantt(best[1], os.path.join(figdir, f"{name}.png"),
              title=f"{v}{cp}: {c['model']} on {c['cluster']}, {c['dataset']}, {batch}, "
                    f"{topo.world_size} GPUs; iteration {best[1].iteration_s:.3f} s")
        out[f"{name} ({c['model']}, {c['cluster']}, {c['dataset']}, {batch}, {topo.world_size} GPUs{cp})"] = \
            f"{rel}/{name}.png"
    return out


def results_json(doc: dict) -> dict:
    """What the figures folder's results.json keeps: every summary, and per study and cluster the
    numbers the next report quotes for clusters it no longer runs (reports/previous.py); the runs
    themselves are in results/bench/<study>.json (with every run, the file outgrew 2 MB).

    >>> results_json({"summary": {}, "runs": []})
    {'summary': {}, 'clusters': {}}
    """
    from megatron_zeppelin.reports.previous import by_cluster
    out = {k: v for k, v in doc.items() if k != "runs"}
    out["clusters"] = by_cluster(doc.get("runs", []))
    return out


def _rounded(x):
    """``x`` with every float at 6 significant digits: results.json holds the summaries, and
    results/bench/*.json (the report's inputs) keep every run at full precision.

    >>> _rounded({"a": [1.23456789, 2], "b": "c"})
    {'a': [1.23457, 2], 'b': 'c'}
    """
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_rounded(v) for v in x]
    return x


def _one_micro_batch(r) -> bool:
    from megatron_zeppelin.reports.headline import accumulated, pipelined
    return not accumulated(r) and not pipelined(r)


def _accumulated(r) -> bool:
    from megatron_zeppelin.reports.headline import accumulated, pipelined
    return accumulated(r) and not pipelined(r)


def _pipelined(r) -> bool:
    from megatron_zeppelin.reports.headline import pipelined
    return pipelined(r)


# One summary per regime, each run in exactly one: an iteration of several micro-batches is a regime of
# its own (a rank's imbalance partly averages out over them), never mixed into the one-micro-batch ones.
REGIMES = (("global batches with gradient accumulation (several micro-batches per iteration)", _accumulated),
           ("pipeline stages (1F1B, several micro-batches per iteration)", _pipelined),
           ("memory-bound batches (every GPU holds what its memory allows; one micro-batch per iteration)",
            lambda r: _one_micro_batch(r) and r.get("regime") == "memory"),
           ("a set number of tokens per GPU (with the fastest activation recompute that fits; one micro-batch "
            "per iteration)", lambda r: _one_micro_batch(r) and r.get("regime", "fixed") != "memory"))


def _doc(matrix: str, records) -> dict:
    """The report's results document: the runs, the headline (reports/headline.py), the overall
    summary (every study but the ablations, whose baselines are not at their best setting, those
    planning Zeppelin with --zeppelin-balance-memory, a different Zeppelin, runs planned with a perturbed
    profile or with a GPU cost term off, and the check of the cuts' batches), one summary per regime, and
    per study."""
    from megatron_zeppelin.reports.cuts import LONG, SHORT
    from megatron_zeppelin.reports.headline import headline
    from megatron_zeppelin.sim.matrix import summarize, summarize_by_study
    best = [r for r in records if not r["study"].startswith("ablation") and not r.get("balance_memory")
            and not r.get("profile_error")  # a run planned with a wrong profile (robustness) is its own study
            and r.get("gpu_term_off", "nothing") == "nothing"  # so is one with a GPU cost term off
            and r["study"] not in (LONG, SHORT)]  # the cut's check repeats configurations: counted once elsewhere
    overall = summarize(best)
    regimes = {}
    for title, member in REGIMES:
        part = [r for r in best if member(r)]
        if part:
            regimes[title] = summarize(part)
    return {"matrix": matrix, "headline": headline(best), "summary": overall["summary"], "balance": overall["balance"],
            "regimes": regimes, "studies": summarize_by_study(records), "runs": records}


def _is_project_matrix(path) -> bool:
    from megatron_zeppelin.sim.matrix import DEFAULT_MATRIX, resolve_matrix
    return bool(path) and os.path.abspath(resolve_matrix(path)) == os.path.abspath(DEFAULT_MATRIX)


def run(args) -> int:
    from megatron_zeppelin.sim.matrix import Progress, load_matrix, resolve_matrix, run_matrix
    from megatron_zeppelin.plots.matrix import scaling_lines, speedup_bars
    from megatron_zeppelin.reports.matrix import render

    me = " ".join(["zeppelin report"] + ([f"--results {' '.join(args.results)}"] if args.results else
                                         [f"--matrix {args.matrix}"] if args.matrix else []) +
                  ([f"--validation {args.validation}"] if args.validation else []) +
                  [f"--out {args.out}", f"--figures {args.figures}"])
    if args.results:
        records, commands, paper = [], [], True
        for path in args.results:
            try:
                with open(path) as f:
                    part = json.load(f)
            except (OSError, ValueError) as e:
                raise ZeppelinError(f"cannot read --results {path}: {e}") from None
            records += part["runs"]
            paper = paper and _is_project_matrix(part.get("matrix"))
            commands.append(written_to(part.get("command"), path)
                            or f"zeppelin bench --matrix {part.get('matrix', args.matrix)} --json {path}")
        doc = _doc(args.matrix or part.get("matrix"), records)
        commands.append(me)
    else:
        path = resolve_matrix(args.matrix)
        paper = _is_project_matrix(path)
        items, _ = load_matrix(path)
        records = run_matrix(items, None, progress=Progress.for_stream(args.no_progress))
        doc = _doc(path, records)
        commands = [me]
    from megatron_zeppelin.reports import previous as prev
    prev_path = getattr(args, "previous", None) or os.path.join(args.figures, "results.json")
    before = prev.load(prev_path)  # read before this report's results.json replaces it
    os.makedirs(args.figures, exist_ok=True)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    rel = os.path.relpath(os.path.abspath(args.figures), out_dir)
    figs = {}
    for study in sorted({r["study"] for r in doc["runs"]}):
        speedup_bars(doc["runs"], os.path.join(args.figures, f"speedup_{study}.png"), study)
        figs[f"speedup bars: {study}"] = f"{rel}/speedup_{study}.png"
        if "scaling" in study:
            scaling_lines(doc["runs"], os.path.join(args.figures, f"{study}.png"), study)
            figs[f"scaling lines: {study}"] = f"{rel}/{study}.png"
    if paper:  # the paper's timelines and regime notes belong to the project's matrix, not a user's own
        figs.update(_gantts(args.figures, rel))
    validation = None
    if args.validation:
        try:
            with open(args.validation) as f:
                validation = json.load(f)
        except (OSError, ValueError) as e:
            raise ZeppelinError(f"cannot read --validation {args.validation}: {e}") from None
        if validation.get("command"):
            commands.insert(len(commands) - 1, written_to(validation["command"], args.validation))
    if getattr(args, "made_with", None):  # `zeppelin bench --out-dir --report`: the one command that ran all below
        commands.insert(0, f"{args.made_with}   # runs all of the following:")
    made = ""
    if getattr(args, "made_with", None) and getattr(args, "started", None):  # the one command, and how long it took
        from megatron_zeppelin.sim.matrix import clock_text
        made = (f"Regenerate every table below with one command, writing only under its --out-dir, report and "
                f"figures: `{args.made_with}` (it took {clock_text(time.perf_counter() - args.started)} for this "
                f"report, simulations and figures, on a machine of {os.cpu_count()} CPU cores).")
    try:
        with open(os.path.join(args.figures, "results.json"), "w") as f:  # the summaries, not every run
            json.dump(_rounded(results_json(doc)), f, separators=(",", ":"), default=float)
        with open(args.out, "w") as f:
            f.write(render(doc, commands, figs, validation, notes=(_NOTES + _coverage(doc) + _cuts(doc)) if paper else "",
                           previous=(before, prev_path) if before else None, made=made))
    except OSError as e:
        raise ZeppelinError(f"cannot write the report: {e}") from None
    print(f"wrote {args.out} and {len(figs)} figures in {args.figures}")
    return 0


def _coverage(doc: dict) -> str:
    """Which of the project matrix's studies this report holds (the whole matrix may be too slow to
    run on the machine at hand; the report says so rather than passing a part off as the whole)."""
    from megatron_zeppelin.sim.matrix import load_matrix
    _, matrix = load_matrix(None)
    have = sorted({r["study"] for r in doc["runs"]})
    missing = [s for s in matrix["studies"] if s not in have]
    if not missing:
        return ""
    return (f"\n\nStudies in this report: {', '.join(have)}; not run for it: {', '.join(missing)} "
            "(too slow for the machine this report was made on; `zeppelin bench` without --studies runs them all).")


def _cuts(doc: dict) -> str:
    """What the project matrix's studies cut (their ``cut`` text) and what it costs (reports/cuts.py)."""
    from megatron_zeppelin.reports.cuts import render as render_cuts
    from megatron_zeppelin.sim.matrix import load_matrix
    _, matrix = load_matrix(None)
    have = {r["study"] for r in doc["runs"]}
    cuts = {s: st["cut"] for s, st in matrix["studies"].items() if st.get("cut") and s in have}
    return "\n\n" + render_cuts(doc["runs"], cuts)


_NOTES = """What the simulator models (megatron_zeppelin/sim/): the Plan's own schedule ops on per-GPU NVLink
ports and per-NIC links with max-min fair sharing; the attention engine's step order (K/V exchange
overlapped with each ring step's compute, dK/dV exchange after it, local documents inside the first
exchange); QKV/output projections on the attention layout, MLP on the linear layout, the remap
all-to-alls around the MLP; TP all-reduces for 13B/30B; the vocab head; and Megatron DDP's gradient
all-reduce after the backward (not overlapped: Megatron's default). One layer is simulated with all
ranks starting together and multiplied by the layer count. Hardware figures: megatron_zeppelin/presets/clusters/*.yaml
(their `assumed` fields are assumptions, not published numbers); workloads: megatron_zeppelin/presets/datasets/*.yaml.

Two batch regimes (megatron_zeppelin/presets/runs/paper.yaml), both physically realisable (spec/memory.py: weights,
gradients, ZeRO-1 optimizer states and activations within 90% of memory_GB). *Memory-bound*
(`tokens_per_gpu: memory`): each GPU holds what its memory allows without activation recompute
and the batch fills 0.8 of that. *A set number of tokens per GPU* (16K): with the fastest
activation recompute that holds it (none; Megatron's selective recompute of core_attn, +mlp,
+layernorm; full), the same for every strategy; the forward it recomputes runs again inside each
layer's backward, in the prediction and in the simulator's task graph (spec/recompute.py; recomputing a
ring-split document's core attention repeats its K/V ring exchanges, a local document's repeats none). In both, every strategy must fit the capacity on
every rank: a plan over it is out of memory. The lower bound: every document's attention whole,
all linear work and (with TP) the TP all-reduces' bandwidth, and the least recompute, perfectly
balanced, all other communication hidden; where each strategy deploys its own recompute, the least
is the fastest that holds the mean tokens per GPU (a perfectly balanced run fits it), one bound per
configuration whichever a strategy deploys (sim/runs.py ``run_config``).

Iterations of several micro-batches (a study's `global_batch_tokens`: Megatron's --global-batch-size, each
micro-batch a batch of either regime, gradient-accumulated: a rank's time is the sum over its
micro-batches, then the gradient reduce) are summarised apart, as *global batches with gradient
accumulation*, and those split into pipeline stages (`pipeline`, 1F1B) apart again: a rank's imbalance
partly averages out over its micro-batches, so they are never mixed into the one-micro-batch summaries.

The baselines, and the source each follows: `packed_dp`, Megatron-LM's packed sequences over plain
DP; `static_cp`, Transformer Engine's p2p context parallelism (DualChunkSwap zigzag halves) over
Megatron's `--context-parallel-size` groups; `allgather_cp`, the all-gather CP of the Llama 3 paper
(arXiv 2407.21783); `hybrid_dp`, ByteScale (arXiv 2502.21231): data-aware sharding (a document
split over the fewest ranks its memory and the balanced FLOPs share need) and its balance
scheduler within the global batch; `dynamic_cp`, Megatron-Core's dynamic context parallelism with
the packing-aware scheduler of Megatron-LM's dev branch (PR #5154: DefaultDynamicCPScheduler,
next_hdp_group_packing_aware in megatron/core/datasets/data_schedule*.py; a short document may take
a larger CP group where that shortens the round, idle ranks are filled by doubling a group, else
by one group of every rank), its HDP rounds balanced and memory-checked one at a time and run one
after another with a barrier after each, `max_seqlen_per_dp_cp_rank` fixed per run.
Zeppelin weighs their shapes too (planner/portfolio/shapes.py: uniform CP groups of every size, routed
or not; hybrid_dp's groups for batches of up to 256 documents or 4 per rank, dynamic_cp's for up
to 4 documents per rank; the search stops once a plan is predicted within 2% of the lower bound),
so its prediction is not above theirs on a batch but by that margin; the simulator may still
disagree with the prediction.

Memory balance (the imbalance tables: per-rank peak activation memory, max / mean): Zeppelin's
default search takes a plan within 1.10x only where it costs at most 3% predicted time, so a batch
whose long documents' ring members hold few tokens stays imbalanced (every rank still fits the
capacity). The study `balance_memory` (if in this report) plans Zeppelin with
`--zeppelin-balance-memory`: every rank capped at 1.10x the batch's mean tokens in both layouts
(planner/portfolio/memory.py), its memory balanced by construction, its speed what that costs."""
