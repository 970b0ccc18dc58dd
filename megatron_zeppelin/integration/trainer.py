"""The training loop on megatron-core: GPTModel (Zeppelin spec), megatron-core DDP, AdamW over
``main_grad``, warmup + cosine LR, gradient clipping, checkpoints, per-iteration metrics.

Any strategy drives it (``zeppelin``, ``packed_dp``, ``static_cp``, ...): the plan decides where
every token goes and the same engine executes it. Launch with ``run_distributed(train_worker, W,
options)`` (CPU demo and tests) or under torchrun (``zeppelin train``); on CUDA it uses NCCL.

Per iteration (rank 0 logs, JSONL + TensorBoard when present): loss (domain per-token mean),
tokens/s, predicted imbalance (plan cost max/mean), measured imbalance (per-rank CPU seconds of
the step, max/mean), bytes sent per link class (attention rings from the engine's counters, remap
from the plan), and the per-rank numbers behind them.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List

import torch
import torch.distributed as dist

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner import Planner
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.spec.words import Link


@dataclass
class TrainOptions:
    model: str = "tiny"
    steps: int = 30
    tokens_per_batch: int = 4096  # trained tokens per global micro-batch (whole domain)
    max_doc_tokens: int = 2048
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 5
    clip_grad: float = 1.0
    weight_decay: float = 0.01
    seed: int = 1234
    data_path: str = ""  # Megatron indexed dataset prefix; "" = the embedded corpus
    tp: int = 1
    ep: int = 0  # MoE expert-parallel size over the domain's DP ranks (0 = integration/moe.py's default)
    save: str = ""
    save_interval: int = 0
    load: str = ""
    log_path: str = ""  # JSONL of per-iteration metrics (rank 0)
    tensorboard_dir: str = ""
    label: str = ""  # shown in the progress line
    progress: bool = True
    zeppelin: Dict = field(default_factory=dict)  # ZeppelinConfig fields


def _bar(frac: float, width: int = 20) -> str:
    n = int(round(frac * width))
    return "#" * n + "." * (width - n)


def remap_bytes(plan, rank: int, hidden: int, dtype_bytes: int, layers: int) -> Dict[str, int]:
    """Bytes this rank sends for the remap in one iteration: per layer to-linear, to-attention
    (not after the last layer), and the mirror of both in the backward."""
    out = {Link.NVLINK: 0, Link.NIC: 0}
    per = (2 * layers - 1) * 2
    for m in plan.remap:
        if m.src == rank:
            link = Link.NVLINK if plan.topology.same_node(m.src, m.dst) else Link.NIC
            out[link] += m.tokens * hidden * dtype_bytes * per
    return out


def train_worker(rank: int, world: int, options: dict) -> dict:
    """One rank of a training run (torch.distributed already initialized)."""
    from megatron_zeppelin.integration import checkpoint
    from megatron_zeppelin.distributed.counters import CommCounters
    from megatron_zeppelin.integration.batch import build_rank_batch
    from megatron_zeppelin.integration.data import BatchSampler, DocumentDataset, batch_documents, default_corpus
    from megatron_zeppelin.integration.plan_check import check_plan_agreement
    from megatron_zeppelin.integration.runtime import build_model, init_parallel, wrap_ddp
    from megatron_zeppelin.integration.step import make_optimizer, train_step, warmup_cosine
    from megatron_zeppelin.distributed import progress

    o = TrainOptions(**options)
    zcfg = ZeppelinConfig(**{**o.zeppelin, "tp": o.tp})
    m = load_model(o.model)
    from megatron_zeppelin.integration.moe import expert_parallel_size
    rt = init_parallel(tp=o.tp, seed=o.seed, ep=expert_parallel_size(m, world // o.tp, o.ep))
    topo = Topology.from_world(rt.domain_size, zcfg.gpus_per_node, zcfg.nics_per_node, zcfg.gpu_nic_map)
    profile = load_profile(zcfg.cluster)
    planner = Planner(topo, profile, m, zcfg)  # the run's cost model, built once for every step's plan
    if not o.data_path and dist.get_rank() == 0:
        default_corpus()  # built once, by one rank
    dist.barrier()
    prefix = o.data_path or default_corpus()
    ds = DocumentDataset(prefix)
    sampler = BatchSampler(ds.lengths, o.tokens_per_batch, o.max_doc_tokens, seed=o.seed)

    sp_group = rt.tp_group if zcfg.sequence_parallel else None
    model = build_model(m, tp=o.tp, max_seq=max(o.max_doc_tokens + 1, 4096), device=rt.device, ep=rt.ep,
                        recompute=zcfg.recompute,  # megatron-core recompute, as the plans are priced
                        sequence_parallel=zcfg.sequence_parallel)
    ddp = wrap_ddp(model)
    opt = make_optimizer([p for p in ddp.parameters()], lr=o.lr, weight_decay=o.weight_decay)
    sched = warmup_cosine(opt, o.warmup, o.steps, o.min_lr_ratio)
    start = 0
    if o.load:
        start = checkpoint.load(o.load, ddp.module, opt, sched)["step"]
    lead = dist.get_rank() == 0
    tb = None
    if lead and o.tensorboard_dir:
        try:
            from torch.utils.tensorboard import SummaryWriter
            tb = SummaryWriter(o.tensorboard_dir)
        except ImportError:
            tb = None
    log = open(o.log_path, "a") if (lead and o.log_path) else None
    scale = m.head_dim ** -0.5
    history: List[dict] = []
    for step in range(start, o.steps):
        progress.mark_step(step + 1)  # the launcher names the step a stopped rank was in
        docs = batch_documents(ds, sampler, step)
        plan = planner.plan([d.numel() - 1 for d in docs])
        if step == start or zcfg.debug_plan:
            check_plan_agreement(plan, rt.domain_group)
        counters = CommCounters()
        batch = build_rank_batch(docs, plan, rt.domain_rank, rt.domain_group, softmax_scale=scale,
                                 device=rt.device, counters=counters, sp_group=sp_group)
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        r = train_step(ddp, opt, batch, domain_group=rt.domain_group, tp_group=rt.tp_group,
                       tp_rank=rt.tp_rank, clip_grad=o.clip_grad, scheduler=sched, ep_group=rt.ep_group)
        cpu_s, wall_s = time.process_time() - c0, time.perf_counter() - t0
        rb = remap_bytes(plan, rt.domain_rank, m.hidden, 4, m.layers)
        mine = torch.tensor([cpu_s, wall_s, counters.bytes_by_link.get(Link.NVLINK, 0) + rb[Link.NVLINK],
                             counters.bytes_by_link.get(Link.NIC, 0) + rb[Link.NIC]], dtype=torch.float64, device=rt.device)
        allr = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(allr, mine)
        allr = torch.stack(allr).cpu()  # [world, 4]
        cpu = allr[:, 0].tolist()
        rec = {"step": step + 1, "loss": r["loss"], "grad_norm": r["grad_norm"], "lr": sched.get_last_lr()[0],
               "tokens": o.tokens_per_batch, "wall_s": float(allr[:, 1].max()),
               "tokens_per_s": o.tokens_per_batch / float(allr[:, 1].max()),
               "pred_imbalance": float(plan.imbalance), "meas_imbalance": max(cpu) / (sum(cpu) / len(cpu)),
               "cpu_s_per_rank": cpu, "bytes_nvlink": int(allr[:, 2].sum()), "bytes_nic": int(allr[:, 3].sum()),
               "classes": plan.class_counts(), "docs": len(docs)}
        history.append(rec)
        if lead:
            if log:
                log.write(json.dumps(rec) + "\n")
                log.flush()
            if tb:
                for k in ("loss", "tokens_per_s", "pred_imbalance", "meas_imbalance", "bytes_nvlink", "bytes_nic", "lr"):
                    tb.add_scalar(f"zeppelin/{k}", rec[k], step + 1)
            every = max(1, o.steps // 10)
            if o.progress and ((step + 1) % every == 0 or step == start or step + 1 == o.steps):
                print(f"  [{o.label or zcfg.strategy:>9}] {_bar((step + 1) / o.steps)} step {step + 1:3d}/{o.steps} "
                      f"loss {r['loss']:.4f}  {rec['tokens_per_s']:7.0f} tok/s  imbalance pred "
                      f"{rec['pred_imbalance']:.2f} meas {rec['meas_imbalance']:.2f}  "
                      f"nvlink {rec['bytes_nvlink'] / 1e6:6.2f} MB  nic {rec['bytes_nic'] / 1e6:6.2f} MB",
                      flush=True)
        if o.save and ((o.save_interval and (step + 1) % o.save_interval == 0) or step + 1 == o.steps):
            saved = checkpoint.save(o.save, step + 1, ddp.module, opt, sched, extra={"options": asdict(o)})
            if lead and o.progress:
                print(f"  saved checkpoint {saved} (step {step + 1})", flush=True)
    if log:
        log.close()
    if tb:
        tb.close()
    return {"history": history if lead else None, "rank": rank}


def run_local(options: TrainOptions, world: int, timeout: float = 900.0) -> List[dict]:
    """Train on ``world`` local processes (gloo on CPU, NCCL with CUDA); rank 0's history."""
    from megatron_zeppelin.distributed.launch import run_distributed

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    res = run_distributed(train_worker, world, asdict(options), timeout=timeout, backend=backend)
    return res[0]["history"]
