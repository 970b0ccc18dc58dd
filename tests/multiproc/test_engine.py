"""The attention engine on gloo equals single-process per-document causal attention (out and
q/k/v gradients) for every strategy's plan, counts the bytes the Plan's ops say, and handles bad
input (zero-token rank, NaN, plan mismatch) without hanging. ``semantics``: gloo's tag matching or
NCCL's (ZEPPELIN_P2P_SEMANTICS, distributed/nccl_matching.py); NCCL's with -m slow."""

import random

import pytest
import torch
import torch.distributed as dist

from megatron_zeppelin.attention.engine import verify_plan
from megatron_zeppelin.attention.testing import check_engine, expected_step_bytes, hand_plan, toy_route
from megatron_zeppelin.spec.config import STRATEGIES, ZeppelinConfig
from megatron_zeppelin.distributed.launch import run_distributed
from megatron_zeppelin.distributed.nccl_matching import ENV
from megatron_zeppelin.planner import plan_batch
from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE
from megatron_zeppelin.planner.types import PlanError
from megatron_zeppelin.spec.topology import Topology

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
TAGS_FIRST = [pytest.param("tags"), pytest.param("nccl", marks=pytest.mark.slow)]  # NCCL's rules: -m slow


def batch(seed: int, world: int):
    """Odd lengths, one huge document, many tiny ones."""
    rng = random.Random(seed)
    return [rng.randrange(150, 400) | 1] + [rng.randrange(1, 6) for _ in range(2 * world)] + \
           [rng.randrange(7, 90) for _ in range(world)]


def strategy_plan(strategy: str, lengths, topo: Topology):
    """The planner's default capacity (2x the mean: long documents must split); if the batch
    does not fit that, a capacity of the whole batch."""
    for cap in (0, sum(lengths)):
        cfg = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, capacity_tokens=cap)
        try:
            return plan_batch(lengths, topo, TOY_PROFILE, TOY_MODEL, cfg, strategy=strategy)
        except PlanError:
            if cap:
                raise


def _run_cases(rank, world, cases):
    """cases: [(name, plan, dtype, kv_heads)] -> per case errors and byte counts (one spawn)."""
    out = []
    for name, plan, dtype, kvh in cases:
        r = check_engine(plan, rank, dist.group.WORLD, heads=4, kv_heads=kvh, d=8, dtype=dtype, seed=len(name))
        c = r.pop("counters")
        r["bytes_by_step"] = dict(c.bytes_by_step)
        r["bytes_by_link"] = dict(c.bytes_by_link)
        out.append((name, r))
    return out


def _check_results(results, cases):
    for ci, (name, plan, dtype, kvh) in enumerate(cases):
        row_bytes = 2 * kvh * 8 * torch.empty((), dtype=dtype).element_size()
        fwd_total = {}
        for rank, res in enumerate(results):
            cname, r = res[ci]
            assert cname == name
            assert r["tokens"] == plan.tokens(rank)
            err = max(r["out"], r["dq"], r["dk"], r["dv"])
            assert err <= TOL[dtype], (name, rank, r)
            assert all(r[k + "_shape_ok"] for k in ("out", "dq", "dk", "dv"))
            want = {**expected_step_bytes(plan, rank, row_bytes, "fwd"), **expected_step_bytes(plan, rank, row_bytes, "bwd")}
            assert r["bytes_by_step"] == want, (name, rank)
            for (ph, q, s), n in r["bytes_by_step"].items():
                if ph == "fwd":
                    fwd_total[(q, s)] = fwd_total.get((q, s), 0) + n
        # the forward bytes of each ring step are the Plan's op bytes (scaled to this test's K/V row size)
        size = {x.id: x.size for x in plan.rings}
        comm = {x.id: x.comm for x in plan.rings}
        plan_fwd = {}
        for o in plan.schedule:
            if comm[o.ring] == "allgather" or o.step < size[o.ring] - 1:
                plan_fwd[(o.queue, o.step)] = plan_fwd.get((o.queue, o.step), 0) + o.nbytes
        assert {k: v * row_bytes // plan.kv_bytes_per_token for k, v in plan_fwd.items()} == fwd_total, name


def _faults(rank, world, plan, other):
    out = {}
    r = check_engine(plan, rank, dist.group.WORLD, nan=True)
    out["nan"] = r["out"]
    try:
        verify_plan(other if rank == 1 else plan, dist.group.WORLD)
        out["verify"] = "passed"
    except PlanError as e:
        out["verify"] = str(e)
    verify_plan(plan, dist.group.WORLD)  # equal plans pass (and the group is still usable)
    return out


def default_cases():
    t = Topology(2, 2)
    f64 = torch.float64
    p2p = hand_plan([37, 3, 5, 20, 2, 9, 11], t, [(0, 1, 2, 3), 1, 0, (3, 2), (1, 2), 3, (0, 1)])
    cases = [("hand_p2p", p2p, f64, 2), ("hand_p2p_routed_gqa1", toy_route(p2p), f64, 1),
             ("hand_p2p_f32", p2p, torch.float32, 2),
             ("hand_allgather_routed", toy_route(hand_plan([29, 4, 13], t, [(0, 3, 1), 2, (2, 1)], comm="allgather")), f64, 2),
             ("zero_token_rank", toy_route(hand_plan([10, 5], t, [(0, 1, 2), 0])), f64, 2)]
    lengths = batch(1, 4)
    for s in ("packed_dp", "static_cp", "zeppelin", "hybrid_dp"):
        cases.append((s, strategy_plan(s, lengths, t), f64, 2))
    return cases


@pytest.mark.parametrize("semantics", TAGS_FIRST)
def test_engine_world4_2x2_several_strategies_and_faults(semantics):
    cases = default_cases()
    assert cases[4][1].tokens(3) == 0
    _check_results(run_distributed(_run_cases, 4, cases, timeout=240, env={ENV: semantics}), cases)
    t = Topology(2, 2)
    plan = hand_plan([9, 4, 6], t, [(0, 2), 1, 3])
    other = hand_plan([9, 4, 7], t, [(0, 2), 1, 3])
    res = run_distributed(_faults, 4, plan, other, timeout=300, env={ENV: semantics})
    assert all(r["nan"] for r in res)  # NaN propagated, nobody hung
    assert "first difference at plan.lengths[2]" in res[1]["verify"]
    assert all("digest" in r["verify"] for r in res)


# --- the full matrix (slow) ----------------------------------------------------------------------
MATRIX = [(Topology(1, 1), 1), (Topology(1, 2), 2), (Topology(1, 4), 4), (Topology(2, 2), 4), (Topology(2, 4), 8)]


@pytest.mark.slow
@pytest.mark.parametrize("semantics", ["tags", "nccl"])
@pytest.mark.parametrize("topo,world", MATRIX, ids=lambda x: getattr(x, "describe", lambda: str(x))()[:12])
def test_engine_every_strategy_matrix(topo, world, semantics):
    cases = []
    for seed in (2, 3):
        lengths = batch(seed, world)
        for s in STRATEGIES:
            for dtype, kvh in ((torch.float64, 2), (torch.float32, 1)):
                cases.append((f"{s}_{seed}_{dtype}", strategy_plan(s, lengths, topo), dtype, kvh))
    if topo.nodes > 1:
        cases.append(("routed", toy_route(strategy_plan("hybrid_dp", batch(4, world), topo)), torch.float64, 2))
    _check_results(run_distributed(_run_cases, world, cases, timeout=600, env={ENV: semantics}), cases)


# --- pipelined backward (dK/dV of step s in flight during step s+1's compute) ---------------------
def pipelined_cases():
    """World 6 as 2 nodes x 3: a 3- and a 4-member inter ring in one queue (the shorter one's dK/dV
    comes home while the longer still computes), routed through proxies (ranks 2 and 5 are only
    proxies in the inter queue), then an intra ring and local documents (the inter queue's last
    dK/dV wait is deferred into them); the same placement as all-gather rings. float64."""
    t = Topology(2, 3)
    where = [(0, 3, 4), (0, 1, 3, 4), (0, 1, 3, 4), (1, 2), 5, 2, (4, 3, 1)]
    lengths = [61, 90, 33, 20, 9, 14, 23]
    p2p = toy_route(hand_plan(lengths, t, where))
    ag = toy_route(hand_plan(lengths, t, where, comm="allgather"))
    assert {r.size for r in p2p.rings if r.cls == "inter"} == {3, 4}
    inter = {x for r in p2p.rings if r.cls == "inter" for x in r.ranks}
    assert {o.src for o in p2p.schedule if o.queue == "inter"} - inter == {2, 5}  # pure proxies
    return [("pipelined_p2p_routed", p2p, torch.float64, 2), ("pipelined_p2p_routed_gqa1", p2p, torch.float64, 1),
            ("pipelined_allgather_routed", ag, torch.float64, 2)]


@pytest.mark.parametrize("semantics", TAGS_FIRST)
def test_engine_pipelined_backward_mixed_rings_routed(semantics):
    cases = pipelined_cases()
    _check_results(run_distributed(_run_cases, 6, cases, timeout=240, env={ENV: semantics}), cases)


def chunked(plan, rows: int):
    """``plan`` with every routed piece cut into chunks of at most ``rows`` rows (program.py
    ``chunk_cuts``, as route_schedule cuts them with --zeppelin-relay-chunk-bytes)."""
    from dataclasses import replace
    from megatron_zeppelin.planner.program import chunk_cuts
    ops = []
    for o in plan.schedule:
        per = o.nbytes // max(1, o.stop - o.start)
        cuts = [(o.start, o.stop)] if o.stage == "direct" else chunk_cuts(o.start, o.stop, per, rows * per)
        ops += [replace(o, start=a, stop=b, nbytes=(b - a) * per) for a, b in cuts]
    return replace(plan, schedule=tuple(ops))


@pytest.mark.parametrize("semantics", ["nccl", pytest.param("tags", marks=pytest.mark.slow)])
def test_engine_routed_chunked_relays(semantics):
    """The pipelined-backward placement with every routed piece cut into uneven chunks of <= 3 rows
    (relays forward chunk by chunk, step_order's waves): outputs and gradients equal per-document
    attention, under NCCL's matching rules and gloo's tags."""
    cases = pipelined_cases()[:1] + pipelined_cases()[2:]
    cases = [(name + "_chunked", chunked(p, 3), dt, kv) for name, p, dt, kv in cases]
    for _, p, _, _ in cases:
        sizes = [o.stop - o.start for o in p.schedule if o.stage == "transfer"]
        assert max(sizes) == 3 and min(sizes) < 3  # several chunks a piece, uneven
    _check_results(run_distributed(_run_cases, 6, cases, timeout=240, env={ENV: semantics}), cases)


# --- a2a (Ulysses) rings: head groups over the ring, whole documents per group --------------------
def a2a_cases(world: int):
    """(name, plan, heads, kv_heads): a2a rings with local documents; MHA and GQA (the K/V heads
    split over the ring too: heads % G == kv_heads % G == 0, as TE asserts)."""
    t = Topology(1, 2) if world == 2 else Topology(2, 2)
    cfg = ZeppelinConfig(gpus_per_node=t.gpus_per_node, cp_comm="a2a", cp_size=2)  # static_cp in TE's a2a mode
    static = plan_batch(batch(1, world), t, TOY_PROFILE, TOY_MODEL, cfg, strategy="static_cp")
    if world == 2:
        p = hand_plan([41, 3, 17, 6], t, [(0, 1), 0, (0, 1), 1], comm="a2a")
        return [("a2a_w2_mha", p, 4, 4), ("a2a_w2_gqa", p, 4, 2), ("a2a_w2_static_cp", static, 4, 2)]
    # an inter ring of 4 and two intra rings of 2 (both queues), local documents
    p4 = hand_plan([53, 5, 29, 11, 2, 19], t, [(0, 1, 2, 3), 1, (0, 1), (2, 3), 3, (0, 1, 2, 3)], comm="a2a")
    p2 = hand_plan([37, 8, 23, 4], t, [(1, 0), 2, (3, 2), 0], comm="a2a")
    return [("a2a_w4_mha", p4, 4, 4), ("a2a_w4_gqa", p4, 8, 4), ("a2a_w4_gqa_rings2", p2, 4, 2),
            ("a2a_w4_static_cp", static, 4, 2), ("a2a_w4_zeppelin", zeppelin_a2a_plan(), 4, 2)]


def zeppelin_a2a_plan():
    """Zeppelin's own plan whose intra rings run as Ulysses (planner/partitioner/ulysses_rings.py):
    two long documents on rings of 2, the short ones local (1 node x 4, TOY_MODEL's 4 Q, 2 K/V heads)."""
    rng = random.Random(0)
    lengths = [rng.randrange(1000, 6000) for _ in range(2)] + [rng.randrange(1, 300) for _ in range(10)]
    p = plan_batch(lengths, Topology(1, 4), TOY_PROFILE, TOY_MODEL, ZeppelinConfig(gpus_per_node=4), strategy="zeppelin")
    assert p.meta.variant.endswith("+a2a") and p.class_counts()["local"] > 0, p.meta
    return p


def _run_a2a(rank, world, cases):
    out = []
    for name, plan, hq, hk in cases:
        r = check_engine(plan, rank, dist.group.WORLD, heads=hq, kv_heads=hk, d=8, dtype=torch.float64,
                         seed=len(name))
        out.append((name, {**r, "counters": dict(r["counters"].bytes_by_step)}))
    return out


def a2a_step_bytes(plan, rank: int, hq: int, hk: int, d: int = 8, elt: int = 8) -> dict:
    """Bytes this rank sends per (phase, queue, step) by the Plan's a2a ops: forward, step 0 a head
    group's Q/K/V and step 1 its output from each op's source; backward, the mirrored ops (dO,
    dQ/dK/dV) from each op's destination."""
    size = {r.id: r.size for r in plan.rings}
    out: dict = {}
    for o in plan.schedule:
        width = ((hq + 2 * hk) if o.step == 0 else hq) // size[o.ring] * d * elt
        for phase, sender in (("fwd", o.src), ("bwd", o.dst)):
            if sender == rank:
                out[(phase, o.queue, o.step)] = out.get((phase, o.queue, o.step), 0) + (o.stop - o.start) * width
    return out


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])  # 4: ~55 s
def test_engine_a2a_rings_exact(world):
    cases = a2a_cases(world)
    assert all(p.rings and {r.comm for r in p.rings} == {"a2a"} for _, p, _, _ in cases)
    _check_head_sharded(cases, run_distributed(_run_a2a, world, cases, timeout=240), a2a_step_bytes)


def _check_head_sharded(cases, results, step_bytes):
    """Every rank's float64 errors within tolerance, shapes right, and bytes per step the Plan's."""
    for ci, (name, plan, hq, hk) in enumerate(cases):
        for rank, res in enumerate(results):
            cname, r = res[ci]
            assert cname == name and r["tokens"] == plan.tokens(rank)
            assert max(r["out"], r["dq"], r["dk"], r["dv"]) <= TOL[torch.float64], (name, rank, r)
            assert all(r[k + "_shape_ok"] for k in ("out", "dq", "dk", "dv"))
            assert r["counters"] == step_bytes(plan, rank, hq, hk), (name, rank)


# --- a2a+p2p (TE's hierarchical CP) rings: all-to-all over heads inside a2a groups, a zigzag ring of
# the groups' head-sharded super blocks across them -------------------------------------------------
def hier_cases(world: int):
    """(name, plan, heads, kv_heads): a2a+p2p rings with local documents, GQA (K/V heads < Q heads,
    both split by the a2a group, as TE asserts) and MHA. World 4: groups of 2 over 2 nodes; world
    8: groups of 2 (a ring of 4 groups) and of 4 (a ring of 2), two rings in one queue. Each world also
    runs a plan static_cp built in this mode (--zeppelin-cp-comm-type a2a+p2p, TOY_MODEL's 4 Q and 2
    K/V heads), not a hand-built one."""
    if world == 4:  # 2 nodes x 2: groups (0, 1) and (2, 3), the ring of groups across the nodes
        t = Topology(2, 2)
        p = hand_plan([53, 5, 29, 11, 2, 19], t, [(0, 1, 2, 3), 1, (0, 1, 2, 3), 2, 3, (0, 1, 2, 3)],
                      comm="a2a+p2p", a2a=2)
        return [("hier_w4_gqa", p, 4, 2), ("hier_w4_mha", p, 4, 4), ("hier_w4_static_cp", static_hier(t, 4), 4, 2)]
    t = Topology(2, 4)  # 2 nodes x 4: groups of 2 (a ring of 4 groups) and of 4 (a ring of 2)
    lengths, where = [93, 5, 29, 11, 2, 19, 40], [tuple(range(8)), 1, tuple(range(8)), 2, 3, (4, 5, 6, 7), 6]
    return [("hier_w8_a2_gqa", hand_plan(lengths, t, where, comm="a2a+p2p", a2a=2), 4, 2),
            ("hier_w8_a4_gqa", hand_plan(lengths[:5], t, where[:5], comm="a2a+p2p", a2a=4), 8, 4),
            ("hier_w8_static_cp", static_hier(t, 8), 4, 2)]


def static_hier(t: Topology, world: int):
    """static_cp's own plan in a2a+p2p mode: CP = the whole domain, a2a groups of 2 inside a node."""
    cfg = ZeppelinConfig(gpus_per_node=t.gpus_per_node, cp_comm="a2a+p2p", cp_size=world, cp_a2a_size=2)
    p = plan_batch(batch(2, world), t, TOY_PROFILE, TOY_MODEL, cfg, strategy="static_cp")
    assert p.meta.hierarchical_cp_sizes == f"2 {world // 2}", p.meta
    return p


def hier_step_bytes(plan, rank: int, hq: int, hk: int, d: int = 8, elt: int = 8) -> dict:
    """Bytes this rank sends per (phase, queue, step) by the Plan's a2a+p2p ops: the ring of groups'
    steps s < p carry one head group's K/V forward (s < p - 1) and K/V plus dK/dV backward; step p
    Q/K/V (forward, from the source) and dQ/dK/dV (backward, from the destination); step p + 1 the
    output (forward, from the source) and dO (backward, from the destination)."""
    ring = {r.id: r for r in plan.rings}
    out: dict = {}
    for o in plan.schedule:
        r = ring[o.ring]
        a, p = r.a2a, r.size // r.a2a
        rows = o.stop - o.start
        if o.step < p:
            sends = [("fwd", o.src, 2 * hk)] if o.step < p - 1 else []
            sends += [("bwd", o.src, 2 * hk)] * ((o.step < p - 1) + 1)
        else:
            w = (hq + 2 * hk) if o.step == p else hq
            sends = [("fwd", o.src, w), ("bwd", o.dst, w)]
        for phase, sender, w in sends:
            if sender == rank:
                key = (phase, o.queue, o.step)
                out[key] = out.get(key, 0) + rows * w // a * d * elt
    return out


@pytest.mark.parametrize("world", [2, 4, pytest.param(8, marks=pytest.mark.slow)])
def test_engine_a2a_p2p_rings_exact(world):
    if world == 2:  # two ranks cannot hold a ring of a2a groups: refused, naming the split
        with pytest.raises(ValueError, match="a2a\\+p2p ring 0 of 2 ranks needs groups"):
            hand_plan([9], Topology(2, 1), [(0, 1)], comm="a2a+p2p", a2a=2)
        cfg = ZeppelinConfig(gpus_per_node=1, cp_comm="a2a+p2p")  # static_cp says why, naming the flags
        with pytest.raises(PlanError, match="at least 4 ranks.*--zeppelin-cp-comm-type p2p or a2a"):
            plan_batch(batch(1, 2), Topology(2, 1), TOY_PROFILE, TOY_MODEL, cfg, strategy="static_cp")
        return
    cases = hier_cases(world)
    assert all({r.comm for r in p.rings} == {"a2a+p2p"} for _, p, _, _ in cases)
    _check_head_sharded(cases, run_distributed(_run_a2a, world, cases, timeout=300), hier_step_bytes)
