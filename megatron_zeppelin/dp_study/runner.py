"""Train the same tiny GPT on the same data with each DP variant, on W spawned gloo ranks.

One spawn per world size runs every (balance mode, variant): each builds the model fresh from the
same initial weights, trains ``steps`` global batches of the embedded corpus (same documents, same
order), and records per step the global per-token loss and the step time, then one extra step is
run under the memory tracker (measure.py) -- after the trajectory, so it cannot change it.

Balance off plans each batch with ``packed_dp`` (documents whole, token-balanced); on with
``zeppelin`` (quadratic-cost balance, long documents split over rings, remap). Both go through the
integration's batch path (integration/batch.py) and the Zeppelin core attention, on a process group
of their own so attention traffic never interleaves with the variants' gradient collectives.

Per step it also records: when the backward's last computation ended (a gradient hook on the
embedding output: the embedding's backward is the last of the backward), so *exposed
communication* = (gradients ready - backward compute end) + the post-step parameter all-gather
(ZeRO-1/2); and, on the first (warm-up, untimed) step, the collectives on the gradient group with
their bytes (traffic.py; a dispatch mode costs time, so it never runs on a timed step).
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from typing import List, Sequence

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.dp_study.base import VARIANTS, VariantError
from megatron_zeppelin.spec.words import DPVariant


@dataclass
class RunSpec:
    variants: Sequence[DPVariant] = tuple(VARIANTS)
    steps: int = 6
    balance: Sequence[bool] = (False, True)
    tokens_per_batch: int = 8192  # global batch, trained tokens
    max_doc_tokens: int = 1024
    lr: float = 3e-3
    seed: int = 1234
    model: str = "tiny"
    measure_memory: bool = True
    bucket_bytes: int = 1 << 16
    epoch: bool = False  # True: steps = one pass over every document of the corpus (``steps`` ignored)

    def check(self) -> "RunSpec":
        for v in self.variants:
            if v not in VARIANTS:
                raise VariantError(f"unknown DP variant '{v}' (set --variants to some of {', '.join(VARIANTS)})")
        self.variants = tuple(DPVariant(v) for v in self.variants)  # members, from the flag's words
        if self.steps < 2:
            raise ZeppelinError(f"--steps must be >= 2 (one to warm up, one to time), got {self.steps}")
        return self


def epoch_steps(lengths, tokens_per_batch: int, max_doc_tokens: int) -> int:
    """Global batches that train every document once (each trains min(L-1, cap) tokens).

    >>> epoch_steps([5, 300, 40, 12, 7, 90], tokens_per_batch=100, max_doc_tokens=64)
    2
    """
    total = sum(min(int(n) - 1, max_doc_tokens or int(n)) for n in lengths if int(n) >= 2)
    return max(2, -(-total // tokens_per_batch))


def _initial_state(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _load(model, state):
    import torch
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(state[n])


def worker(rank: int, world: int, spec: RunSpec, corpus: str, verbose: bool = True) -> List[dict]:
    """Spawned body: every (balance, variant) on this rank; returns one record per run."""
    import torch
    import torch.distributed as dist

    from megatron_zeppelin.spec.config import ZeppelinConfig
    from megatron_zeppelin.integration.batch import build_rank_batch
    from megatron_zeppelin.integration.data import BatchSampler, DocumentDataset, batch_documents
    from megatron_zeppelin.integration.runtime import build_model, init_parallel
    from megatron_zeppelin.integration.step import forward_loss_sum
    from megatron_zeppelin.spec.model import load_model
    from megatron_zeppelin.planner import Planner
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.spec.topology import Topology
    from megatron_zeppelin.dp_study.variants import get_variant
    from megatron_zeppelin.dp_study.measure import peak_step_bytes, rss_peak_bytes
    from megatron_zeppelin.spec.memory import predict_memory
    from megatron_zeppelin.dp_study.traffic import CollectiveCounter

    m = load_model(spec.model)
    init_parallel(tp=1, seed=spec.seed)
    ranks = list(range(world))
    att_group = dist.new_group(ranks)  # attention engine + remap + loss
    grad_group = dist.new_group(ranks)  # the variants' gradient collectives
    topo = Topology.from_world(world, world)  # one node of W ranks
    profile = load_profile("h200")
    ds = DocumentDataset(corpus)
    sampler = BatchSampler(ds.lengths, spec.tokens_per_batch, spec.max_doc_tokens, seed=spec.seed)
    steps = epoch_steps(ds.lengths, spec.tokens_per_batch, spec.max_doc_tokens) if spec.epoch else spec.steps
    batches = [batch_documents(ds, sampler, s) for s in range(steps + 1)]
    init = _initial_state(build_model(m))
    scale = m.head_dim ** -0.5
    records = []
    for balance in spec.balance:
        strategy = "zeppelin" if balance else "packed_dp"
        cfg = ZeppelinConfig(strategy=strategy, gpus_per_node=world)
        planner = Planner(topo, profile, m, cfg)
        plans = [planner.plan([d.numel() - 1 for d in docs]) for docs in batches]
        for name in spec.variants:
            if name == DPVariant.SINGLE and world != 1:
                continue  # the plain single-process baseline exists at one rank only
            variant = get_variant(name, bucket_bytes=spec.bucket_bytes)
            model = build_model(m)
            _load(model, init)
            module = variant.wrap(model, grad_group)
            opt = variant.optimizer(module, spec.lr)
            marks = {}
            # The embedding's output gradient is the backward's last computation (its own backward
            # is a scatter-add): its time marks the end of backward compute for every variant.
            def mark_backward_end(mod, inp, out, marks=marks):
                if out.requires_grad:
                    out.register_hook(lambda g: marks.__setitem__("bwd_end", time.perf_counter()))

            model.embedding.register_forward_hook(mark_backward_end)

            def one_step(s):
                batch = build_rank_batch(batches[s], plans[s], rank, att_group, softmax_scale=scale)
                variant.zero_grad(module, opt)
                t0 = time.perf_counter()
                local = forward_loss_sum(variant.forward_module(module), batch)
                (local * variant.loss_scale(world) / batch.domain_tokens).backward()
                t1 = time.perf_counter()
                variant.finish(module)
                tf = time.perf_counter()
                opt.step()
                to = time.perf_counter()
                variant.after_step(module)
                ta = time.perf_counter()
                total = local.detach().double().reshape(1)
                dist.all_reduce(total, group=att_group)  # also the end-of-step barrier
                t2 = time.perf_counter()
                exposed = (tf - min(marks.get("bwd_end", t1), t1)) + (ta - to)
                return float(total) / batch.domain_tokens, t1 - t0, t2 - t0, exposed, batch

            losses, step_s, fwd_bwd_s, exposed_s = [], [], [], []
            counter = CollectiveCounter(variant.comm_groups(module, grad_group), world)
            for s in range(steps):
                if s == 0:
                    with counter:  # the warm-up step: collectives counted, not timed
                        loss, fb, st, ex, batch = one_step(s)
                else:
                    loss, fb, st, ex, batch = one_step(s)
                losses.append(loss)
                step_s.append(st)
                fwd_bwd_s.append(fb)
                exposed_s.append(ex)
            mem, pred = {}, {}
            last = plans[steps]
            mem_tokens = max(last.tokens(rank), sum(len(x) for x in last.linear_layout[rank]))
            if spec.measure_memory:
                mem = peak_step_bytes(lambda: one_step(steps), module, opt)
                pred = predict_memory(m, mem_tokens, dp=world, zero_stage=variant.zero_stage,
                                      param_bytes=4, grad_bytes=4).to_dict()
            rec = {"variant": name, "balance": balance, "strategy": strategy, "world": world, "rank": rank,
                   "model": m.name, "losses": losses, "step_s": step_s, "fwd_bwd_s": fwd_bwd_s,
                   "exposed_comm_s": exposed_s, "traffic": counter.summary(),
                   "tokens_per_step": spec.tokens_per_batch,
                   "att_tokens": [plans[s].tokens(rank) for s in range(steps)],
                   "mem": mem, "mem_pred": pred, "mem_tokens": mem_tokens, "rss_peak_bytes": rss_peak_bytes(),
                   "classes": [plans[s].class_counts() for s in range(steps)],
                   "params": sum(p.numel() for p in model.parameters())}
            records.append(rec)
            if verbose and rank == 0:  # progress on the parent's stderr (spawned ranks inherit it)
                print(f"W={world} balance={'on' if balance else 'off'} {name}: loss "
                             f"{losses[0]:.4f} -> {losses[-1]:.4f}, median step "
                             f"{statistics.median(step_s[1:]) * 1e3:.0f} ms", file=sys.stderr, flush=True)
            del module, opt, model
    return records
