"""GroupCache on gloo: intra-node groups, rails and plan ring groups are created once and work;
processes that ask for groups in a different order get a clear error on every rank, not a hang."""

import torch
import torch.distributed as dist

from megatron_zeppelin.attention.testing import hand_plan
from megatron_zeppelin.distributed.groups import GroupCache, GroupOrderError
from megatron_zeppelin.distributed.launch import run_distributed
from megatron_zeppelin.spec.topology import Topology


def _sum(group, x):
    t = torch.tensor([float(x)])
    dist.all_reduce(t, group=group)
    return t.item()


def _body(rank, world):
    t = Topology(2, 2)
    cache = GroupCache(t).setup()
    out = {"intra": _sum(cache.intra_node(), rank), "rail": _sum(cache.rail(), rank)}
    made = cache.created
    cache.setup()  # cached: nothing new
    out["recreated"] = cache.created - made
    plan = hand_plan([12, 5, 9, 3], t, [(0, 1, 2), (3, 2), 1, 0])
    rg = cache.ring_groups(plan)
    out["rings"] = {rid: _sum(g, 1) for rid, g in sorted(rg.items())}
    made = cache.created
    cache.ring_groups(plan)
    out["ring_recreated"] = cache.created - made
    # two domains of 2 ranks (one node each): rank sets are global ranks of each domain
    two = GroupCache(Topology(1, 2), domains=[[0, 2], [1, 3]]).setup()
    out["domain_intra"] = _sum(two.intra_node(), rank)
    try:
        cache.create([(0, 1), (2, 3)] if rank != 1 else [(2, 3), (0, 1)])
        out["order"] = "no error"
    except GroupOrderError as e:
        out["order"] = str(e)
    return out


def test_group_cache_world4():
    res = run_distributed(_body, 4, timeout=300)
    for rank, r in enumerate(res):
        assert r["intra"] == (1.0 if rank < 2 else 5.0)
        assert r["rail"] == (2.0 if rank % 2 == 0 else 4.0)
        assert r["recreated"] == 0 and r["ring_recreated"] == 0
        sizes = {0: 3.0, 1: 2.0}  # ring (0,1,2) and ring (3,2) (plan ids in queue order: inter first)
        assert all(v == sizes[rid] for rid, v in r["rings"].items())
        assert r["domain_intra"] == (2.0 if rank % 2 == 0 else 4.0)
        assert "processes [1]" in r["order"]
