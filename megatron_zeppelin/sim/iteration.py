"""One training iteration of a Plan, simulated: iteration time, per-rank timelines, NIC utilisation.

The simulator reads only the Plan (layouts, rings, remap moves, the schedule's CommOps: the same ops
the runtime executes) and the profile; it never looks at which strategy made the plan.

Iteration = forward of every layer -> vocab head (forward + backward, linear layout) -> backward of
every layer -> DP gradient all-reduce (allreduce.py; overlapped with the backward only when
``overlap_grad_reduce``, as Megatron DDP's ``--overlap-grad-reduce``; off by default, like Megatron).
The optimizer step and the embedding are left out (the same for every strategy).

Layers (``layers``):
- ``"scale"`` (default, fast): one layer's forward and one layer's backward are simulated, each with
  all ranks starting together, and multiplied by the layer count: a barrier at every layer boundary.
  Close when ranks are coupled at each layer boundary (the remap all-to-all, rings over the busy
  ranks); an upper bound in general, since without a barrier a rank that is fast in one phase can
  run ahead (tests measure the gap against "all"). The last layer's remap back is counted.
- ``"all"``: every layer chained, no barriers (exact for the model; L times slower to simulate).

Activation recompute (the plan's, ``Plan.meta.recompute``; spec/recompute.py) is in each layer's
backward: the forward it reruns, as tasks, before the backward it serves (layer.py).
"""

from __future__ import annotations

from collections import defaultdict
from math import inf
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from megatron_zeppelin.spec.model import ModelSpec
from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.planner.build.padding import charged_plan
from megatron_zeppelin.planner.types import Plan
from megatron_zeppelin.spec.hardware import HardwareProfile
from megatron_zeppelin.spec.host import HostModel
from megatron_zeppelin.spec.recompute import Recompute
from megatron_zeppelin.sim.allreduce import exposed_s
from megatron_zeppelin.sim.compute import LayerCosts
from megatron_zeppelin.sim.events import FLOW, TaskGraph
from megatron_zeppelin.sim.host import shared_makespan
from megatron_zeppelin.sim.layer import LayerBuilder
from megatron_zeppelin.sim.network import LinkTable
from megatron_zeppelin.spec.words import Layout


@dataclass(frozen=True)
class SimOptions:
    layers: str = "scale"  # "scale" | "all"
    overlap_grad_reduce: bool = False
    grad_bytes_per_param: int = 4
    allreduce: bool = True
    tp_comm: bool = True
    remap_point: str = "attention_output"  # or "core_attention" (what-if; see layer.py)
    timeline: bool = True  # collect SimResult.timeline (Gantt charts); the bench's matrix reads none


@dataclass
class SimResult:
    iteration_s: float
    forward_s: float
    head_s: float
    backward_s: float
    allreduce_s: float  # the whole DP all-reduce
    allreduce_exposed_s: float
    layers: int
    mode: str
    rank_compute_s: List[Dict[str, float]]  # per rank, seconds per category over the iteration
    nic: List[Dict[str, float]]  # per global NIC: bytes and utilisation (bytes / (bandwidth x iteration))
    link_bytes: Dict[str, float]  # over the iteration, per link class: nvlink, nic (and any further level)
    timeline: List[tuple] = field(default_factory=list)  # (rank, category, label, start, end) of one layer fwd+bwd

    def to_dict(self, timeline: bool = False) -> dict:
        d = asdict(self)
        if not timeline:
            d.pop("timeline")
        return d

    @property
    def recompute_s(self) -> float:
        """The busiest rank's recomputed forward work (its own seconds; waiting not included)."""
        return max((r.get("recompute", 0.0) for r in self.rank_compute_s), default=0.0)

    @property
    def max_nic_util(self) -> float:
        return max((max(n["util_out"], n["util_in"]) for n in self.nic), default=0.0)


class _Run:
    """A graph, its result, and how many times it counts in the iteration."""

    def __init__(self, g: TaskGraph, links: LinkTable, times: int, offset: float = 0.0, until: float = inf):
        self.g, self.times, self.offset = g, times, offset
        self.res = g.run(links.capacity, until)


def simulate(plan: Plan, profile: HardwareProfile, model: ModelSpec, *, tp: int = 1,
             options: Optional[SimOptions] = None, sequence_parallel: bool = False,
             host: Optional[HostModel] = None, beyond: Optional[float] = None) -> SimResult:
    """One iteration of ``plan`` on ``profile``; ``host``: the ranks share one CPU (the CPU
    validation's, spec/host.py: its cores shared by the ranks' compute, copies and engine CPU;
    None on GPUs). ``beyond``: raise sim/dominated.py ``Beyond`` as soon as the time simulated so
    far (a lower bound of the iteration's) passes it."""
    opt = options or SimOptions()
    if opt.layers not in ("scale", "all"):
        from megatron_zeppelin.errors import ZeppelinError
        raise ZeppelinError(f"unknown layers mode '{opt.layers}' (set --sim-layers to scale or all)")
    topo = plan.topology
    cost = CostModel(model, profile, topo, tp, plan_recompute(plan), sequence_parallel, host)
    # a padded plan (TE's / Megatron's CP pad rows: planner/build/padding.py) as the real system runs
    # it, as its prediction charges it; attention_graph (the engine's own rows, validation) does not
    plan = charged_plan(plan, cost)
    costs = LayerCosts(cost)
    links = LinkTable.of_cost(cost)
    L = model.layers
    world = plan.world_size
    head = [costs.head_iteration_s(cost.layout_rows(plan.tokens(r, Layout.LINEAR))) for r in range(world)]
    head_s = max(head, default=0.0) if host is None else shared_makespan(head, host.cores)
    runs: List[_Run] = []
    if opt.layers == "scale":
        cache: dict = {}
        gf = TaskGraph()
        LayerBuilder(plan, costs, links, gf, opt.tp_comm, cache, opt.remap_point).forward()
        left = inf if beyond is None else beyond - head_s  # what the layers may take before it
        rf = _Run(gf, links, L, until=left / L)
        runs, fwd, bwd, layer_ends = [rf], L * rf.res.makespan, 0.0, []
        for n, rc in reversed(cost.recompute.groups(L)):  # the backward's last layers first (block recompute)
            gb = TaskGraph()
            LayerBuilder(plan, costs, links, gb, opt.tp_comm, cache, opt.remap_point).backward(recompute=rc)
            rb = _Run(gb, links, n, offset=sum(r.res.makespan for r in runs),  # the timeline: one layer of each
                      until=(left - fwd - bwd) / n)
            runs.append(rb)
            layer_ends += [fwd + head_s + bwd + (i + 1) * rb.res.makespan for i in range(n)]
            bwd += n * rb.res.makespan
    else:
        g = TaskGraph()
        b = LayerBuilder(plan, costs, links, g, opt.tp_comm, None, opt.remap_point)
        marks = []
        for i in range(L):  # the last layer skips the remap back (and so its gradient)
            b.forward(remap_back=i < L - 1)
        fwd_marks = list(b.cursor)
        for r in range(world):
            b.compute(r, head[r], "head")
        per_layer = [rc for n, rc in cost.recompute.groups(L) for _ in range(n)]  # block: the first N
        for i in reversed(range(L)):
            b.backward(remap_back=i < L - 1, recompute=per_layer[i])
            marks.append(g.join(list(b.cursor)))
        run = _Run(g, links, 1, until=inf if beyond is None else beyond)
        runs = [run]
        end = run.res.end
        fwd = max(float(end[t]) for t in fwd_marks if t is not None)
        total = run.res.makespan
        layer_ends = [float(end[m]) for m in marks]
        bwd = total - fwd - head_s  # the head is inside the chained graph; report it separately
    ar = cost.dp_allreduce_s(opt.grad_bytes_per_param) if opt.allreduce else 0.0
    backward_end = fwd + head_s + bwd
    ar_exp = exposed_s(ar, layer_ends, backward_end, opt.overlap_grad_reduce)
    iteration = backward_end + ar_exp
    return _collect(plan, runs, links, head, iteration, fwd, head_s, bwd, ar, ar_exp, L, opt.layers, opt.timeline)


def plan_recompute(plan: Plan) -> Recompute:
    """The activation recompute the plan was priced with (its meta; none when absent)."""
    return plan.meta.recompute or Recompute()


def _collect(plan, runs, links, head, iteration, fwd, head_s, bwd, ar, ar_exp, L, mode, timed=True) -> SimResult:
    world = plan.world_size
    per_rank = [defaultdict(float) for _ in range(world)]
    link_bytes = np.zeros(len(links.keys))
    timeline = []
    for run in runs:
        g, res = run.g, run.res
        for i in range(len(g)):
            tag = g.tag[i]
            if g.kind[i] == FLOW:
                for a in g.links[i]:  # two ports, or four above the NIC level
                    link_bytes[a] += g.nbytes[i] * run.times
            elif tag is not None:  # a compute task: its own seconds (at one core, if on a shared host)
                per_rank[tag[0]][tag[1]] += g.seconds(i) * run.times
            if timed and tag is not None and res.end[i] > res.start[i]:
                timeline.append((tag[0], tag[1], tag[2], float(res.start[i] + run.offset),
                                 float(res.end[i] + run.offset)))
    if mode == "scale":  # the head is not in the layer graphs
        for r in range(world):
            per_rank[r]["head"] += head[r]
    nics = []
    kinds = defaultdict(float)
    for idx, (kind, i) in enumerate(links.keys):
        if kind in ("core", "io", "host"):  # CPU resources carry compute, not bytes
            continue
        kinds[links.link_class(kind)] += link_bytes[idx] / 2  # each flow counted at both ends
    for n in range(plan.topology.num_nics):
        out_b = float(link_bytes[links.index[("nic_out", n)]])
        in_b = float(link_bytes[links.index[("nic_in", n)]])
        cap = float(links.capacity[links.index[("nic_out", n)]])
        denom = cap * iteration if iteration > 0 else 1.0
        nics.append({"nic": n, "bytes_out": out_b, "bytes_in": in_b, "util_out": out_b / denom,
                     "util_in": in_b / denom})
    return SimResult(iteration_s=iteration, forward_s=fwd, head_s=head_s, backward_s=bwd, allreduce_s=ar,
                     allreduce_exposed_s=ar_exp, layers=L, mode=mode, rank_compute_s=[dict(d) for d in per_rank],
                     nic=nics, link_bytes=dict(kinds), timeline=timeline)


def attention_graph(plan: Plan, profile: HardwareProfile, model: ModelSpec, *, tp: int = 1,
                    host: Optional[HostModel] = None):
    """(task graph, links) of one layer's core attention, forward then backward, every rank starting
    together (what one engine call plus its backward takes); ``host`` as ``simulate``'s."""
    cost = CostModel(model, profile, plan.topology, tp, host=host)
    links = LinkTable.of_cost(cost)
    g = TaskGraph()
    b = LayerBuilder(plan, LayerCosts(cost), links, g, False)
    b.attention(False)
    b.attention(True)
    return g, links


def simulate_attention(plan: Plan, profile: HardwareProfile, model: ModelSpec, *, tp: int = 1,
                       host: Optional[HostModel] = None) -> float:
    """Seconds of ``attention_graph``: the term validated against measured runs."""
    g, links = attention_graph(plan, profile, model, tp=tp, host=host)
    return g.run(links.capacity).makespan


def accumulate(steps: Sequence[SimResult]) -> SimResult:
    """One iteration of gradient-accumulation steps, as Megatron runs it: each step's forward, head and
    backward back to back, the DP all-reduce once at the end. Its exposure is the last step's (with
    ``overlap_grad_reduce`` Megatron overlaps it with the last step's backward only: the earlier
    steps accumulate without a reduce). Compute seconds and bytes add up; NIC utilisation is over the
    whole iteration; the timeline is the first step's.

    >>> one = SimResult(2.5, 1.0, 0.5, 0.5, 0.5, 0.5, 2, "scale", [{"attention": 1.0}],
    ...                 [{"nic": 0, "bytes_out": 4.0, "bytes_in": 4.0, "util_out": 0.4, "util_in": 0.4}],
    ...                 {"nic": 4.0})
    >>> it = accumulate([one, one])
    >>> it.iteration_s, it.forward_s, it.allreduce_exposed_s, it.rank_compute_s, it.nic[0]["util_out"]
    (4.5, 2.0, 0.5, [{'attention': 2.0}], 0.4444444444444444)
    """
    if len(steps) == 1:
        return steps[0]
    last = steps[-1]
    iteration = sum(s.iteration_s - s.allreduce_exposed_s for s in steps) + last.allreduce_exposed_s
    per_rank = [defaultdict(float) for _ in steps[0].rank_compute_s]
    link_bytes: Dict[str, float] = defaultdict(float)
    nics = [dict(n, bytes_out=0.0, bytes_in=0.0, util_out=0.0, util_in=0.0) for n in steps[0].nic]
    for s in steps:
        for r, d in enumerate(s.rank_compute_s):
            for k, v in d.items():
                per_rank[r][k] += v
        for k, v in s.link_bytes.items():
            link_bytes[k] += v
        for n, m in zip(nics, s.nic):  # utilisation = bytes / (bandwidth x time): weight by each step's time
            for k in ("bytes_out", "bytes_in"):
                n[k] += m[k]
            for k in ("util_out", "util_in"):
                n[k] += m[k] * s.iteration_s / iteration if iteration > 0 else 0.0
    return SimResult(iteration_s=iteration, forward_s=sum(s.forward_s for s in steps),
                     head_s=sum(s.head_s for s in steps), backward_s=sum(s.backward_s for s in steps),
                     allreduce_s=last.allreduce_s, allreduce_exposed_s=last.allreduce_exposed_s, layers=last.layers,
                     mode=last.mode, rank_compute_s=[dict(d) for d in per_rank], nic=nics,
                     link_bytes=dict(link_bytes), timeline=list(steps[0].timeline))


def pipeline(steps: Sequence[SimResult], stages: int) -> SimResult:
    """One iteration of the micro-batches ``steps`` (each simulated over all layers on one stage's
    domain) in Megatron's 1F1B pipeline over ``stages`` stages (planner/iteration.py
    ``one_f_one_b``, the one schedule the planner's Iteration also reads): the layers split evenly,
    so a stage's forward (backward) of micro-batch k is 1/stages of its simulated forward
    (backward), the slowest domain rank of the stage included; the vocab head runs on the last stage
    between its forward and backward; each stage then reduces its own 1/stages of the gradients
    (the last micro-batch's exposure, over stages). Sums (compute, bytes) are ``accumulate``'s: the
    whole model's, over every stage.

    >>> one = SimResult(3.5, 1.0, 0.5, 2.0, 0.8, 0.8, 2, "scale", [{"attention": 1.0}],
    ...                 [{"nic": 0, "bytes_out": 4.0, "bytes_in": 4.0, "util_out": 0.4, "util_in": 0.4}],
    ...                 {"nic": 4.0})
    >>> pipeline([one] * 4, 1).iteration_s == accumulate([one] * 4).iteration_s   # 4 x 3.5 - 3 x 0.8
    True
    >>> pipeline([one] * 4, 2).iteration_s   # (4 + 2 - 1) x (0.5 + 1.0) + the head 4 x 0.5 (last stage) + 0.8 / 2
    9.9
    """
    from megatron_zeppelin.planner.iteration import one_f_one_b
    acc = accumulate(list(steps))
    if stages == 1:
        return acc
    fwd = [[s.forward_s / stages + (s.head_s if i == stages - 1 else 0.0) for s in steps] for i in range(stages)]
    bwd = [[s.backward_s / stages for s in steps] for _ in range(stages)]
    ar = steps[-1].allreduce_exposed_s / stages
    iteration = one_f_one_b(fwd, bwd) + ar
    return SimResult(**{**acc.__dict__, "iteration_s": iteration, "allreduce_s": acc.allreduce_s / stages,
                        "allreduce_exposed_s": ar})
