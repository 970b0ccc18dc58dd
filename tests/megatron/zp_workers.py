"""Spawned bodies for the Megatron equivalence tests (module level: spawn pickles them by name).

``zeppelin_run``: a tiny GPT with the Zeppelin spec trains a few steps on W ranks (TP x domain) for
each plan strategy and returns losses, full (TP-gathered) gradients and the initial full weights.
``reference_run``: the stock model on one process, each document alone, from the same weights.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner import plan_batch
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.topology import Topology

# Per step: documents of varying lengths (long ones get split by zeppelin/static_cp).
STEP_LENGTHS = ([61, 7, 23, 90, 12, 33, 5, 17], [170, 9, 14, 40, 3, 27], [45, 45, 8, 70, 19, 2, 31, 11])
LR = 1e-4
CAPACITY = {2: 150, 4: 80}  # per-rank attention tokens: below the longest documents


def step_docs(step: int, vocab: int):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randint(0, vocab, (L + 1,), generator=g) for L in STEP_LENGTHS[step]]


class LocalOnlyEngine:
    """Per-document causal attention for plans where every document is local (before the real
    engine is importable); refuses any plan with rings."""

    def __init__(self, plan, rank, group, softmax_scale=None, counters=None):
        from megatron_zeppelin.attention.reference import reference_attention
        assert not plan.rings, "LocalOnlyEngine cannot run rings"
        segs = plan.attention_layout[rank]
        assert all(s.start == 0 and s.stop == plan.lengths[s.doc] for s in segs)
        self.lengths = [len(s) for s in segs]
        self.scale = softmax_scale
        self.fn = reference_attention

    def __call__(self, q, k, v):
        return self.fn(q, k, v, self.lengths, self.scale)


def local_engine_factory(plan, rank, group, softmax_scale, counters):
    return LocalOnlyEngine(plan, rank, group, softmax_scale, counters)


def _glu_halves(name: str) -> bool:
    return "linear_fc1" in name


def gather_full(named, tp_group, tp: int, grads: bool = False):
    """Full tensors from TP shards (megatron layouts: column-parallel split on dim 0, with the
    SwiGLU fc1 stored per rank as [gate_r; up_r]; row-parallel on dim 1)."""
    out = {}
    for name, p in named:
        t = (p.main_grad if grads else p.data).detach().clone().float()
        if tp > 1 and getattr(p, "tensor_model_parallel", False):
            dim = p.partition_dim
            parts = [torch.empty_like(t) for _ in range(tp)]
            dist.all_gather(parts, t.contiguous(), group=tp_group)
            if _glu_halves(name):
                halves = [x.chunk(2, dim=0) for x in parts]
                t = torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
            else:
                t = torch.cat(parts, dim=dim)
        out[name.replace("module.", "", 1) if name.startswith("module.") else name] = t.cpu().numpy()
    return out


def load_full(model, full, tp_rank: int, tp: int):
    """Inverse of gather_full for this TP rank."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            t = torch.as_tensor(full[name])
            if tp > 1 and getattr(p, "tensor_model_parallel", False):
                if _glu_halves(name):
                    g, u = t.chunk(2, dim=0)
                    t = torch.cat([g.chunk(tp, 0)[tp_rank], u.chunk(tp, 0)[tp_rank]], 0)
                else:
                    t = t.chunk(tp, dim=p.partition_dim)[tp_rank]
            p.copy_(t)


def zeppelin_run(rank, world, tp, gpus_per_node, strategies, steps, engine, init_state, recompute="none",
                 sequence_parallel=False):
    from megatron_zeppelin.integration.batch import build_rank_batch, default_engine_factory
    from megatron_zeppelin.integration.runtime import build_model, init_parallel, wrap_ddp
    from megatron_zeppelin.integration.step import make_optimizer, train_step

    m = load_model("tiny")
    rt = init_parallel(tp=tp, seed=1234)
    topo = Topology.from_world(rt.domain_size, gpus_per_node)
    profile = load_profile("h200")
    factory = local_engine_factory if engine == "local" else default_engine_factory
    out = {}
    for strategy in strategies:
        model = build_model(m, tp=tp, device=rt.device, recompute=recompute, sequence_parallel=sequence_parallel)
        load_full(model, init_state, rt.tp_rank, tp)
        ddp = wrap_ddp(model)
        opt = make_optimizer([p for p in ddp.parameters()], lr=LR)
        # Small capacity forces zeppelin to split the long documents (intra and inter rings);
        # static_cp runs every document over fixed CP groups of 2 ("static_cp:a2a": in TE's a2a mode;
        # "static_cp:a2a+p2p": TE's hierarchical mode, a CP group of 4 as a ring of 2 a2a groups of 2).
        name, _, comm = strategy.partition(":")
        hier = comm == "a2a+p2p"
        cfg = ZeppelinConfig(strategy=name, gpus_per_node=gpus_per_node, tp=tp, sequence_parallel=sequence_parallel,
                             capacity_tokens=CAPACITY.get(rt.domain_size, 0) if name == "zeppelin" else 0,
                             cp_size=4 if hier else 2, cp_a2a_size=2 if hier else 0,
                             recompute=recompute, cp_comm=comm or None)
        losses, grads, classes = [], [], {}
        for s in range(steps):
            docs = step_docs(s, m.vocab)
            plan = plan_batch([d.numel() - 1 for d in docs], topo, profile, m, cfg)
            batch = build_rank_batch(docs, plan, rt.domain_rank, rt.domain_group, device=rt.device,
                                     softmax_scale=m.head_dim ** -0.5, engine_factory=factory,
                                     sp_group=rt.tp_group if sequence_parallel else None)
            r = train_step(ddp, opt, batch, domain_group=rt.domain_group, tp_group=rt.tp_group,
                           tp_rank=rt.tp_rank, clip_grad=1.0)
            losses.append(r["loss"])
            grads.append(gather_full(ddp.module.named_parameters(), rt.tp_group, tp, grads=True))
            classes = {c: classes.get(c, 0) + n for c, n in plan.class_counts().items()}
            classes.update({f"comm:{r.comm}": classes.get(f"comm:{r.comm}", 0) + 1 for r in plan.rings})
        out[strategy] = {"losses": losses, "grads": grads if rank == 0 else None, "classes": classes,
                         "recompute": model.config.recompute_granularity,
                         "sequence_parallel": model.config.sequence_parallel}
    return out


def reference_run(rank, world, steps, model_name="tiny"):
    """One process: initial full weights (an MoE ``model_name``: all experts), then the oracle's losses
    and gradients."""
    from megatron_zeppelin.integration.runtime import build_model, init_parallel
    from megatron_zeppelin.integration.step import make_optimizer, reference_step

    m = load_model(model_name)
    init_parallel(tp=1, seed=1234)
    model = build_model(m, tp=1, zeppelin=False)
    init = {n: p.detach().clone().numpy() for n, p in model.named_parameters()}
    opt = make_optimizer(list(model.parameters()), lr=LR)
    losses, grads = [], []
    for s in range(steps):
        r = reference_step(model, opt, step_docs(s, m.vocab), clip_grad=1.0)
        losses.append(r["loss"])
        grads.append({n: p.grad.detach().clone().numpy() for n, p in model.named_parameters()})
    return {"init": init, "losses": losses, "grads": grads}
