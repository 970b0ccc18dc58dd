"""Plan-ahead step times: a CPU training loop with planning in the step, on a thread, in a process.

The loop is ``zeppelin train``'s (integration/trainer.py: the demo's tiny GPT on megatron-core, DDP,
AdamW, the embedded corpus, gloo ranks as ``--nodes`` x ``--gpus-per-node``), and every batch is
planned by the run's Planner in one of three modes:

- ``off``: in the step (``planner.plan``), as ``zeppelin train`` and ``--no-zeppelin-plan-ahead`` do;
- ``thread``: integration/plan_ahead.py's PlanAhead on a thread of the training process;
- ``process``: PlanAhead in a spawned process (plan_process.py), the Megatron-LM entry's default.

All three run in ONE launched run, on the same model: ``--rounds`` rounds of ``--block`` steps per
mode, the modes' order rotated every round (this host is shared and its load drifts: alternating
the modes lets each see the same drift). Both workers live for the whole run. A step is timed from
reading its batch to the end of the optimizer step (the plan taken or made, the rank's tensors
built, forward, backward, gradient all-reduce, step), after a barrier, as the slowest rank's time;
the first step of each block is left out (no step before it to plan behind). Reported per mode:
the median step time and its ratio to ``off``, the median time the step spent on its plan (taking
it, or making it when off), and the median of the step without it (``compute``: whether a worker
slows the step's own work). Plans are checked equal to the Planner's own in every mode.

``--shadow-docs N`` adds the load of a large run's planner: with each batch, the same worker (or
the step, when off) also plans a batch of N documents (the loop's lengths drawn again, seed = step)
for a domain of ``--shadow-nodes`` x 8 ranks; its Plan is taken at the next step and dropped. The
demo's own batches plan in milliseconds, so without it the three modes differ by little.

``transfer``: what moving a Plan between processes costs: pickle vs the JSON form with its digest,
dump and load, for 1k documents / 64 ranks and 16k documents / 1024 ranks (a800, llama-7b), least
of ``--repeats``; the process worker sends pickles.

    .venv/bin/python benchmarks/bench_plan_ahead.py --out results/bench/plan_ahead.json
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import time

MODES = ("off", "thread", "process")


def _rank(rank: int, world: int, o: dict) -> dict:
    """One rank of the loop (torch.distributed initialized by the launcher)."""
    import torch.distributed as dist

    from megatron_zeppelin.integration.batch import build_rank_batch
    from megatron_zeppelin.integration.data import BatchSampler, DocumentDataset, batch_documents, default_corpus
    from megatron_zeppelin.integration.plan_ahead import PlanAhead, PlannedBatches, Worker
    from megatron_zeppelin.integration.runtime import build_model, init_parallel, wrap_ddp
    from megatron_zeppelin.integration.step import make_optimizer, train_step, warmup_cosine
    from megatron_zeppelin.planner import Planner
    from megatron_zeppelin.spec.config import ZeppelinConfig
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.spec.model import load_model
    from megatron_zeppelin.spec.topology import Topology

    m = load_model(o["model"])
    zcfg = ZeppelinConfig(gpus_per_node=o["gpus_per_node"], cluster=o["cluster"])
    rt = init_parallel(seed=o["seed"])
    topo = Topology.from_world(rt.domain_size, zcfg.gpus_per_node, zcfg.nics_per_node, zcfg.gpu_nic_map)
    planner = Planner(topo, load_profile(zcfg.cluster), m, zcfg)
    if rank == 0:
        default_corpus()
    dist.barrier()
    ds = DocumentDataset(default_corpus())
    sampler = BatchSampler(ds.lengths, o["tokens"], o["max_doc_tokens"], seed=o["seed"])
    steps = o["rounds"] * o["block"] * len(MODES)
    model = build_model(m, max_seq=max(o["max_doc_tokens"] + 1, 4096), device=rt.device)
    ddp = wrap_ddp(model)
    opt = make_optimizer(list(ddp.parameters()), lr=2e-3, weight_decay=0.01)
    sched = warmup_cosine(opt, 5, steps, 0.1)
    aheads = {"thread": PlanAhead(planner, worker=Worker.THREAD), "process": PlanAhead(planner, worker=Worker.PROCESS)}
    shadows, shadow_planner = {}, None
    if o["shadow_docs"]:  # a large run's planning load, on the same kind of worker
        prof = load_profile(zcfg.cluster)
        shadow_planner = Planner(Topology(o["shadow_nodes"], 8, prof.nics_per_node, prof.gpu_to_nic), prof, m,
                                 ZeppelinConfig(gpus_per_node=8, cluster=zcfg.cluster))
        shadows = {k: PlanAhead(shadow_planner, worker=Worker(k)) for k in aheads}
    rows, step = [], 0
    try:
        for r in range(o["rounds"]):
            order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
            for mode in order:
                batches = (batch_documents(ds, sampler, s) for s in range(step, step + o["block"]))
                ahead, shadow, held = aheads.get(mode), shadows.get(mode), None
                it = batches if ahead is None else PlannedBatches(batches, ahead, _lengths)
                for k in range(o["block"]):
                    big = _shadow_batch(o, step) if shadow_planner is not None else None
                    dist.barrier()
                    t0 = time.perf_counter()
                    if big is not None and shadow is None:
                        shadow_planner.plan(big)  # off: in the step
                    elif big is not None:
                        if held is not None:
                            shadow.take(held)  # planned during the previous step
                        shadow.submit(big)
                        held = big
                    docs = next(it)
                    lengths = _lengths(docs)
                    plan = planner.plan(lengths) if ahead is None else ahead.take(lengths)
                    t1 = time.perf_counter()
                    batch = build_rank_batch(docs, plan, rt.domain_rank, rt.domain_group,
                                             softmax_scale=m.head_dim ** -0.5, device=rt.device)
                    train_step(ddp, opt, batch, domain_group=rt.domain_group, clip_grad=1.0, scheduler=sched)
                    t2 = time.perf_counter()
                    if k == 0 and ahead is not None:
                        assert plan.digest() == planner.plan(lengths).digest(), mode  # the Planner's own
                    rows.append({"round": r, "mode": mode, "step": step, "first": k == 0,
                                 "ahead": bool(ahead.ahead) if ahead is not None else False,
                                 "step_s": t2 - t0, "plan_s": t1 - t0, "compute_s": t2 - t1, "docs": len(docs)})
                    step += 1
                if held is not None:
                    shadow.take(held)  # the block's last, untimed
        workers = {k: str(a.worker) for k, a in aheads.items()}
    finally:
        for a in list(aheads.values()) + list(shadows.values()):
            a.close()
    # the slowest rank's times, per step
    import torch
    mine = torch.tensor([[x["step_s"], x["plan_s"], x["compute_s"]] for x in rows], dtype=torch.float64)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    worst = torch.stack(every).amax(0).tolist()
    for x, (s, p, c) in zip(rows, worst):
        x.update(step_s=s, plan_s=p, compute_s=c)
    return {"rows": rows if rank == 0 else None, "workers": workers, "ranks": rt.domain_size}


def _shadow_batch(o: dict, step: int) -> list:
    """The shadow batch of a step: ``shadow_docs`` lognormal lengths (bench_planner.py's mix: median
    e^7.5 ~ 1.8k tokens, sigma 1.3, at most 64K), seeded by the step."""
    import numpy as np
    return np.random.default_rng(step).lognormal(7.5, 1.3, o["shadow_docs"]).clip(1, 65536).astype(int).tolist()


def _lengths(docs) -> list:
    return [d.numel() - 1 for d in docs]


def summarise(rows: list) -> dict:
    """Median step, plan and compute seconds per mode (first steps of blocks left out), and the
    ratios to ``off``."""
    out = {}
    for mode in MODES:
        got = [x for x in rows if x["mode"] == mode and not x["first"]]
        if not got:
            continue
        out[mode] = {"steps": len(got),
                     "step_ms": 1e3 * statistics.median(x["step_s"] for x in got),
                     "plan_ms": 1e3 * statistics.median(x["plan_s"] for x in got),
                     "compute_ms": 1e3 * statistics.median(x["compute_s"] for x in got),
                     "planned_ahead": sum(x["ahead"] for x in got)}
    base = out.get("off")
    for mode, s in out.items():
        if base and mode != "off":
            s["step_vs_off"] = s["step_ms"] / base["step_ms"]
            s["compute_vs_off"] = s["compute_ms"] / base["compute_ms"]
    return out


def transfer(repeats: int) -> list:
    """Pickle vs JSON (+ digest) of real Plans: bytes, dump and load milliseconds (least of ``repeats``)."""
    import numpy as np

    from megatron_zeppelin.planner import Planner
    from megatron_zeppelin.planner.types import Plan
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.spec.model import load_model
    from megatron_zeppelin.spec.topology import Topology

    prof, out = load_profile("a800"), []
    for docs, nodes in ((1000, 8), (16000, 128)):
        lengths = np.random.default_rng(0).lognormal(7.5, 1.3, docs).clip(1, 65536).astype(int).tolist()
        plan = Planner(Topology(nodes, 8, prof.nics_per_node, prof.gpu_to_nic), prof, load_model("llama-7b")).plan(lengths)

        def least(f):
            best, res = float("inf"), None
            for _ in range(repeats):
                t = time.perf_counter()
                res = f()
                best = min(best, time.perf_counter() - t)
            return 1e3 * best, res

        dump_p, data = least(lambda: pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL))
        load_p, back = least(lambda: pickle.loads(data))
        dump_j, text = least(lambda: (plan.to_json(), plan.digest())[0])
        load_j, back_j = least(lambda: Plan.from_json(text))
        assert back.digest() == back_j.digest() == plan.digest()
        out.append({"docs": docs, "ranks": nodes * 8, "pickle_kb": len(data) / 1e3, "json_kb": len(text) / 1e3,
                    "pickle_dump_ms": dump_p, "pickle_load_ms": load_p,
                    "json_and_digest_dump_ms": dump_j, "json_load_ms": load_j})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench/plan_ahead.json", help="JSON output path")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--gpus-per-node", type=int, default=2)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--cluster", default="h200", help="the planner's hardware profile")
    ap.add_argument("--tokens", type=int, default=8192, help="trained tokens per step (the demo's)")
    ap.add_argument("--max-doc-tokens", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--block", type=int, default=4, help="steps per mode per round (the first is left out)")
    ap.add_argument("--shadow-docs", type=int, default=0, help="documents of the shadow batch (0: none)")
    ap.add_argument("--shadow-nodes", type=int, default=8, help="nodes of 8 ranks of the shadow batch's domain")
    ap.add_argument("--repeats", type=int, default=5, help="transfer: repeats of each dump / load")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--skip-loop", action="store_true")
    ap.add_argument("--skip-transfer", action="store_true")
    ap.add_argument("--timeout", type=float, default=900.0)
    a = ap.parse_args(argv)
    result = {"args": vars(a), "host_cpus": os.cpu_count()}
    if not a.skip_loop:
        from megatron_zeppelin.distributed.launch import run_distributed
        o = {"model": a.model, "cluster": a.cluster, "gpus_per_node": a.gpus_per_node, "tokens": a.tokens,
             "max_doc_tokens": a.max_doc_tokens, "rounds": a.rounds, "block": a.block, "seed": a.seed,
             "shadow_docs": a.shadow_docs, "shadow_nodes": a.shadow_nodes}
        t = time.perf_counter()
        got = run_distributed(_rank, a.nodes * a.gpus_per_node, o, timeout=a.timeout)
        result["loop_s"] = time.perf_counter() - t
        result["workers"] = got[0]["workers"]  # a "thread" under process: it fell back
        result["rows"] = got[0]["rows"]
        result["summary"] = summarise(got[0]["rows"])
        shadow = f", shadow {a.shadow_docs} docs / {8 * a.shadow_nodes} ranks" if a.shadow_docs else ""
        print(f"{a.nodes} nodes x {a.gpus_per_node} ranks, {a.model}, {a.tokens} tokens/step{shadow}, "
              f"{a.rounds} rounds x {a.block} steps per mode (workers: {result['workers']})")
        print(f"{'mode':8} {'steps':>5} {'step ms':>8} {'vs off':>7} {'plan ms':>8} {'compute ms':>10} {'vs off':>7}")
        for mode, s in result["summary"].items():
            print(f"{mode:8} {s['steps']:5d} {s['step_ms']:8.1f} {s.get('step_vs_off', 1.0):7.3f} {s['plan_ms']:8.2f} "
                  f"{s['compute_ms']:10.1f} {s.get('compute_vs_off', 1.0):7.3f}")
    result["transfer"] = [] if a.skip_transfer else transfer(a.repeats)
    for t in result["transfer"]:
        print(f"transfer {t['docs']} docs / {t['ranks']} ranks: pickle {t['pickle_kb']:.0f} kB dump "
              f"{t['pickle_dump_ms']:.1f} ms load {t['pickle_load_ms']:.1f} ms; JSON {t['json_kb']:.0f} kB "
              f"dump+digest {t['json_and_digest_dump_ms']:.1f} ms load {t['json_load_ms']:.1f} ms")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
