"""One kernel call per (queue, step): every Compute of the layer program (all rings of a queue at a
ring step, or the local documents) is ONE varlen call forward and one backward on each rank with
work in it, holding every block the planner lists for that rank (planner/program.ring_step_blocks,
what the cost model prices). Counted at the backend dispatch (kernels/select.py, the real CPU
kernels run behind it) on gloo, for plans with several rings per queue (zigzag p2p and all-gather,
a rank in two rings of one queue, empty blocks of a short document), results still exact."""

import torch
import torch.distributed as dist

from megatron_zeppelin.attention.testing import check_engine, hand_plan
from megatron_zeppelin.distributed.launch import run_distributed
from megatron_zeppelin.planner.program import Compute, attention_program, ring_step_blocks
from megatron_zeppelin.spec.topology import Topology


def _cases():
    t = Topology(2, 2)  # nodes {0, 1}, {2, 3}
    # inter queue: rings (0,1,2,3) [a 3-token document: most chunks empty] and (1,2); intra: (3,2), (2,3), (0,1)
    where = [(0, 1, 2, 3), 1, 0, (3, 2), (1, 2), 3, (0, 1), (2, 3), (0, 1, 2, 3)]
    p2p = hand_plan([37, 3, 5, 20, 2, 9, 11, 15, 3], t, where)
    # all-gather: three inter rings, one intra ring, local documents
    ag = hand_plan([29, 4, 13, 17, 8], t, [(0, 3, 1), 2, (2, 1), (0, 2), (0, 1)], comm="allgather")
    return [("p2p", p2p), ("allgather", ag)]


def _count(rank, world, cases):
    """Per case: the engine's errors and its kernel calls by (phase, Compute ordinal)."""
    from megatron_zeppelin.attention import runner
    from megatron_zeppelin.attention.kernels import select
    now = {"at": None}
    calls: dict = {}
    real_fwd, real_bwd, real_compute = select.forward, select.backward, runner.LayerRun.compute
    seen = {"fwd": 0, "bwd": 0}

    def compute(self, x):
        phase = "bwd" if self.backward else "fwd"
        now["at"] = (phase, seen[phase])
        seen[phase] += 1
        try:
            real_compute(self, x)
        finally:
            now["at"] = None

    def record(spec):
        calls.setdefault(now["at"], []).append((spec.seqlens_q, spec.seqlens_k, spec.causal))

    def fwd(backend, q, k, v, spec, scale):
        record(spec)
        return real_fwd(backend, q, k, v, spec, scale)

    def bwd(backend, dout, q, k, v, out, lse, spec, scale):
        record(spec)
        return real_bwd(backend, dout, q, k, v, out, lse, spec, scale)

    select.forward, select.backward, runner.LayerRun.compute = fwd, bwd, compute
    out = []
    for name, plan in cases:
        calls.clear()
        seen.update(fwd=0, bwd=0)
        r = check_engine(plan, rank, dist.group.WORLD, heads=4, kv_heads=2, d=8, dtype=torch.float64)
        out.append((name, max(r["out"], r["dq"], r["dk"], r["dv"]), dict(calls)))
    return out


def _expected(plan, rank):
    """(phase, Compute ordinal) -> (the Compute, rings with blocks on this rank, key rows of its blocks)."""
    docs = {d.doc: d for d in plan.docs}
    ring = {r.id: r for r in plan.rings}
    has_local = any(d.cls == "local" for d in plan.docs)
    out = {}
    for phase in ("fwd", "bwd"):
        comps = [x for x in attention_program(plan.rings, has_local, phase == "bwd") if isinstance(x, Compute)]
        for n, x in enumerate(comps):
            if x.queue == "local":
                keys = {-1: sum(d.length for d in plan.docs if d.cls == "local" and d.owner == rank)}
            else:
                keys = {rid: sum(k for s in x.steps if s < ring[rid].size
                                 for _, k, _ in ring_step_blocks(ring[rid], docs, ring[rid].ranks.index(rank), s))
                        for rid in x.rings if rank in ring[rid].ranks}
            keys = {rid: k for rid, k in keys.items() if k}
            out[(phase, n)] = (x, len(keys), sum(keys.values()))
    return out


def test_one_kernel_call_per_queue_step_across_rings():
    cases = _cases()
    res = run_distributed(_count, 4, cases, timeout=240)
    for ci, (name, plan) in enumerate(cases):
        several = 0  # Computes in which this rank has blocks of two or more rings
        for rank in range(4):
            cname, err, calls = res[rank][ci]
            assert cname == name and err <= 1e-10, (name, rank, err)
            assert None not in calls, (name, rank, "a kernel call outside any Compute")
            want = _expected(plan, rank)
            assert set(calls) <= set(want), (name, rank)
            for key, (x, rings, keys) in want.items():
                got = calls.get(key, [])
                assert len(got) == (1 if keys else 0), (name, rank, str(x), got)
                assert sum(sum(c[1]) for c in got) == keys, (name, rank, str(x), got)
                several += rings >= 2
        assert several >= 4, (name, several)  # the plans do put several rings in one call
