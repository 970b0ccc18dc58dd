"""Spawned bodies for the MoE equivalence tests (module level: spawn pickles them by name).

``moe_run``: the tiny MoE GPT with the Zeppelin spec (megatron's MoE layer on the linear layout,
alltoall dispatcher, expert parallelism over the domain) trains a few steps on W ranks for each
plan strategy; returns losses and this rank's gradients under single-process names (an expert's
gradient comes from the EP rank that holds it). ``moe_reference_run``: the stock MoE model on one
process, each document alone, from the same weights.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner import plan_batch
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.topology import Topology

from zp_workers import CAPACITY, LR, reference_run, step_docs

MODEL = "tiny-moe"


def _named(model, ep_rank: int, local_experts: int, grads: bool):
    from megatron_zeppelin.integration.moe import global_expert_name

    out = {}
    for name, p in model.named_parameters():
        t = p.main_grad if grads and getattr(p, "main_grad", None) is not None else (p.grad if grads else p.data)
        out[global_expert_name(name.removeprefix("module."), ep_rank, local_experts)] = t.detach().clone().numpy()
    return out


def moe_run(rank, world, gpus_per_node, strategies, steps, init_state, balancing="none", aux_coeff=0.0):
    from megatron_zeppelin.integration import moe
    from megatron_zeppelin.integration.batch import build_rank_batch
    from megatron_zeppelin.integration.runtime import build_model, init_parallel, wrap_ddp
    from megatron_zeppelin.integration.step import make_optimizer, train_step

    m = load_model(MODEL)
    ep = moe.expert_parallel_size(m, world)
    rt = init_parallel(tp=1, seed=1234, ep=ep)
    local = m.experts // ep
    topo = Topology.from_world(rt.domain_size, gpus_per_node)
    # Slow GEMMs make the MLP side worth balancing on these tiny batches, so the plans of steps 0
    # and 1 remap (on the stock h200 profile the remap's latency outweighs a 64-wide MLP; at 0.01
    # TFLOP/s the a2a shapes, which balance tokens themselves, win since the GPU cost terms).
    profile = replace(load_profile("h200"), gemm_tflops=0.001)
    out = {}
    for strategy in strategies:
        model = build_model(m, device=rt.device, ep=ep, moe_balancing=balancing, moe_aux_loss_coeff=aux_coeff)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(torch.as_tensor(init_state[moe.global_expert_name(name, rt.ep_rank, local)]))
        routed = []  # tokens each MoE layer's router saw on this rank, per forward
        for layer in model.decoder.layers:
            layer.mlp.register_forward_pre_hook(lambda mod, args, kw: routed.append(int(args[0].shape[0] * args[0].shape[1])),
                                                with_kwargs=True)
        ddp = wrap_ddp(model)
        opt = make_optimizer([p for p in ddp.parameters()], lr=LR)
        cfg = ZeppelinConfig(strategy=strategy, gpus_per_node=gpus_per_node,
                             capacity_tokens=CAPACITY.get(rt.domain_size, 0) if strategy == "zeppelin" else 0, cp_size=2)
        losses, grads, classes, layouts, seen = [], [], {}, [], []
        for s in range(steps):
            docs = step_docs(s, m.vocab)
            plan = plan_batch([d.numel() - 1 for d in docs], topo, profile, m, cfg)
            batch = build_rank_batch(docs, plan, rt.domain_rank, rt.domain_group, device=rt.device,
                                     softmax_scale=m.head_dim ** -0.5)
            routed.clear()
            r = train_step(ddp, opt, batch, domain_group=rt.domain_group, ep_group=rt.ep_group, clip_grad=1.0)
            seen.append(list(routed))
            losses.append(r["loss"])
            grads.append(_named(ddp.module, rt.ep_rank, local, grads=True))
            classes = {c: classes.get(c, 0) + n for c, n in plan.class_counts().items()}
            layouts.append(([sum(len(x) for x in segs) for segs in plan.attention_layout],
                            [sum(len(x) for x in segs) for segs in plan.linear_layout]))
        out[strategy] = {"losses": losses, "grads": grads, "classes": classes, "layouts": layouts,
                         "ep": ep, "local_experts": local, "routed": seen, "rank": rt.domain_rank}
    return out


def moe_reference_run(rank, world, steps):
    """One process: initial full weights (all experts), then the oracle's losses and gradients."""
    return reference_run(rank, world, steps, MODEL)
