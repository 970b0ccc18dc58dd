"""The edge cases that break context parallelism in the field, through the attention engine on gloo:
float64 outputs and q/k/v gradients equal to single-process per-document causal attention, and finite.

- Transformer Engine #3331 (THD tail padding) and mbridge's crash on a sequence shorter than
  TP x CP x 2: a document shorter than the ring's 2 x G zigzag chunks, down to 1 token, so most ring
  members hold nothing of it;
- Megatron-LM #1764 (NaN on a CP rank that holds only padding): a rank that holds no token at all in
  the attention layout (a ring member with empty chunks, or a rank no document is placed on);
- the ring's divisibility: a document of exactly 2 x G tokens and one of 2 x G + 1;
- a batch of one document.

Each batch runs under every strategy that applies (zeppelin, static_cp with TE's p2p and a2a,
allgather_cp, dynamic_cp, packed_dp, hybrid_dp), on one node (intra rings) and on two (inter rings),
and routed: the two-node plans again with every NIC message of >= 1 byte split over the NICs by the
planner's routing pass (dispatch -> transfer -> combine). All cases of a topology run in one spawn.
The Megatron-LM training-loop side of the same cases is tests/megatron_lm/test_pretrain_edge_cases.py.
"""

import math

import pytest
import torch
import torch.distributed as dist

from megatron_zeppelin.attention.testing import check_engine
from megatron_zeppelin.distributed.launch import run_distributed
from megatron_zeppelin.planner import plan_batch
from megatron_zeppelin.planner.build.assemble import assemble
from megatron_zeppelin.planner.build.checks import check_plan
from megatron_zeppelin.planner.context import Placement
from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE, toy_context
from megatron_zeppelin.planner.types import PlanError
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.topology import Topology

WORLD = 4
TOL = 1e-10
# (name, strategy, config fields): the CP sizes are forced so that each batch meets the widest ring
STRATEGIES = [("zeppelin", "zeppelin", {}), ("static_cp_p2p", "static_cp", {"cp_comm": "p2p", "cp_size": WORLD}),
              ("static_cp_a2a", "static_cp", {"cp_comm": "a2a", "cp_size": 2}),
              ("allgather_cp", "allgather_cp", {"cp_size": WORLD}), ("dynamic_cp", "dynamic_cp", {}),
              ("packed_dp", "packed_dp", {}), ("hybrid_dp", "hybrid_dp", {})]
G = WORLD  # the widest ring: 2 x G zigzag chunks
BATCHES = {"one_token": [1], "one_token_beside_long": [1, 40], "tiny_docs": [1, 2, 1, 3],
           "at_divisibility": [2 * G], "past_divisibility": [2 * G + 1], "one_document": [37],
           "empty_rank": [8, 9, 3]}


def edge_plans(topo: Topology):
    """[(name, plan)] of every batch under every strategy; capacity 2x the mean, else the whole
    batch (a one-document batch cannot split otherwise for some strategies)."""
    out = []
    for bname, lengths in BATCHES.items():
        for sname, strategy, extra in STRATEGIES:
            plan = None
            for cap in (0, sum(lengths)):
                cfg = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, capacity_tokens=cap, **extra)
                try:
                    plan = plan_batch(lengths, topo, TOY_PROFILE, TOY_MODEL, cfg, strategy=strategy)
                    break
                except PlanError:
                    if cap:
                        raise
            out.append((f"{bname}/{sname}", plan))
    return out


def routed(name: str, plan):
    """The same placement with every inter-node message of >= 1 byte split over the NICs by the
    planner's routing pass (only Zeppelin's own plans route; the baselines' rings are routed here
    as test_routed.py does), or None when the plan has no inter-node message."""
    topo = plan.topology
    cfg = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, routing="multi-nic", min_route_bytes=1)
    ctx = toy_context(topo.nodes, topo.gpus_per_node, topo.nics_per_node, config=cfg)
    p = assemble(plan.strategy, list(plan.lengths), ctx, Placement(
        docs=list(plan.docs), rings=list(plan.rings), thresholds=plan.thresholds, routing=True))
    check_plan(p)
    return (name + "/routed", p) if any(o.stage != "direct" for o in p.schedule) else None


def _run(rank, world, cases):
    out = []
    for name, plan in cases:
        hk = 2  # a2a rings need the K/V heads divisible by the ring (TE asserts it)
        r = check_engine(plan, rank, dist.group.WORLD, heads=4, kv_heads=hk, d=8, dtype=torch.float64,
                         seed=len(name))
        r.pop("counters")
        out.append((name, r))
    return out


def check(cases, results):
    for ci, (name, plan) in enumerate(cases):
        for rank, res in enumerate(results):
            cname, r = res[ci]
            assert cname == name and r["tokens"] == plan.tokens(rank)
            errs = [r[k] for k in ("out", "dq", "dk", "dv")]
            assert all(math.isfinite(e) for e in errs), (name, rank, r)  # a NaN makes the error NaN
            assert max(errs) <= TOL, (name, rank, r)
            assert all(r[k + "_shape_ok"] for k in ("out", "dq", "dk", "dv")), (name, rank)


def assert_covers(cases):
    """The batches do reach the cases named above (a planner change must not quietly skip them)."""
    by = dict(cases)
    one = by["one_token/static_cp_p2p"]
    assert one.rings and one.rings[0].size == G and sum(one.tokens(r) == 0 for r in range(WORLD)) == G - 1
    assert any(p.rings and any(p.tokens(r) == 0 for r in range(WORLD)) for _, p in cases)
    assert any(p.tokens(r) == 0 for n, p in cases if n.startswith("empty_rank") for r in range(WORLD))
    kinds = {r.comm for _, p in cases for r in p.rings}
    assert kinds == {"p2p", "allgather", "a2a"}, kinds


@pytest.mark.parametrize("topo", [Topology(2, 2), pytest.param(Topology(1, 4), marks=pytest.mark.slow)],
                         ids=lambda t: t.describe()[:12])
def test_edge_cases_every_strategy_exact(topo):
    cases = edge_plans(topo)
    if topo.nodes > 1:
        more = [r for r in (routed(n, p) for n, p in cases) if r is not None]
        assert any(o.stage == "combine" for _, p in more for o in p.schedule)
        # every batch has a routed inter ring but the 1-token one (a 1-row message stays whole)
        assert {n.split("/")[0] for n, _ in more} == set(BATCHES) - {"one_token"}
        cases += more
    assert_covers(cases)
    check(cases, run_distributed(_run, WORLD, cases, timeout=240))
