"""The remap layer on gloo: attention -> linear -> attention is exact (torch.equal), each direction
equals the single-process reference (rows keyed by token), adjoint in float64, and gradients of a
per-token loss computed in the linear layout equal the single-process gradients."""

import pytest
import torch
import torch.distributed as dist

from megatron_zeppelin.distributed.counters import CommCounters
from megatron_zeppelin.distributed.launch import run_distributed
from megatron_zeppelin.planner.build.assemble import assemble
from megatron_zeppelin.planner.build.checks import check_plan
from megatron_zeppelin.planner.context import Placement
from megatron_zeppelin.planner.build.layout import zigzag_bounds
from megatron_zeppelin.planner.testing import toy_context
from megatron_zeppelin.planner.types import DocPlan, Ring, Thresholds
from megatron_zeppelin.remapping import RemapLayoutError, remap_to_attention, remap_to_linear

HIDDEN = 6
TOPOLOGY = {2: (1, 2), 4: (2, 2), 8: (2, 4)}  # world -> (nodes, gpus per node)


def _plans(world):
    """Plans with remaps: unbalanced local documents, a ring document plus locals, a rank with no
    attention tokens, and an already balanced batch (empty remap)."""
    nodes, gpus = TOPOLOGY[world]
    ctx = toy_context(nodes=nodes, gpus=gpus)
    g = torch.Generator().manual_seed(world)

    def plan(lengths, owners, ring_docs=(), ring_ranks=()):
        docs = []
        for i, L in enumerate(lengths):
            if i in ring_docs:
                docs.append(DocPlan(i, L, "intra" if nodes == 1 else "inter", 0, -1,
                                    zigzag_bounds(L, len(ring_ranks))))
            else:
                docs.append(DocPlan(i, L, "local", -1, owners[i], (0, L)))
        rings = [Ring(0, tuple(ring_ranks), docs[ring_docs[0]].cls, tuple(ring_docs))] if ring_docs else []
        p = assemble("test", lengths, ctx, Placement(docs, rings, Thresholds(1, 1), remap=True))
        check_plan(p)
        return p

    lengths = torch.randint(1, 30, (3 * world,), generator=g).tolist()
    owners = torch.randint(0, max(1, world // 2), (3 * world,), generator=g).tolist()  # upper half empty
    out = [plan(lengths, owners)]
    ring = tuple(range(0, world, 2)) if nodes > 1 else (0, 1)
    out.append(plan([41, 3, 17, 5, 2] + lengths[:world], [0, 1, 0, world - 1, 1] + owners[:world],
                    ring_docs=(0, 2), ring_ranks=ring))
    out.append(plan([5] * world, list(range(world))))  # balanced: no moves
    return out


def _token_values(plan, rank, layout, dtype, seed=0):
    """Rows of ``rank``'s layout: each token's row is a function of (doc, position) only."""
    segs = (plan.attention_layout if layout == "attention" else plan.linear_layout)[rank]
    doc = torch.cat([torch.full((len(s),), s.doc, dtype=torch.float64) for s in segs] + [torch.zeros(0, dtype=torch.float64)])
    pos = torch.cat([torch.arange(s.start, s.stop, dtype=torch.float64) for s in segs] + [torch.zeros(0, dtype=torch.float64)])
    col = torch.arange(HIDDEN, dtype=torch.float64)
    v = doc[:, None] * 1000 + pos[:, None] + col[None, :] / 8 + seed
    return v.to(dtype)


def _layer_cases(rank, world):
    res = []
    w_mlp = torch.linspace(-1, 1, HIDDEN * HIDDEN, dtype=torch.float64).reshape(HIDDEN, HIDDEN)
    for k, plan in enumerate(_plans(world)):
        for dtype, method in ((torch.float32, "p2p"), (torch.bfloat16, "collective"), (torch.float64, "p2p")):
            x = _token_values(plan, rank, "attention", dtype)
            y = remap_to_linear(x, plan, rank, method=method)
            z = remap_to_attention(y, plan, rank, method=method)
            res.append(("exact", k, str(dtype), torch.equal(y, _token_values(plan, rank, "linear", dtype)),
                        torch.equal(z, x)))
        # [t, 1, h] (Megatron's sbhd with b = 1): rows are the first dimension whatever follows.
        x3 = _token_values(plan, rank, "attention", torch.float32)[:, None, :]
        res.append(("3d", k, torch.equal(remap_to_attention(remap_to_linear(x3, plan, rank), plan, rank), x3)))

        # Adjoint in float64: <R x, v> == <x, R^T v> summed over ranks, R^T = remap_to_attention.
        gen = torch.Generator().manual_seed(10 * rank + k)
        xr = torch.randn(plan.tokens(rank), HIDDEN, generator=gen, dtype=torch.float64)
        vr = torch.randn(plan.tokens(rank, "linear"), HIDDEN, generator=gen, dtype=torch.float64)
        dots = torch.stack([(remap_to_linear(xr, plan, rank) * vr).sum(),
                            (xr * remap_to_attention(vr, plan, rank)).sum()])
        dist.all_reduce(dots)
        res.append(("adjoint", k, float(dots[0]), float(dots[1])))

        # Gradients: a per-token loss in the linear layout, back through the remap, against the
        # same loss over all tokens on one process (rows keyed by token).
        x = _token_values(plan, rank, "attention", torch.float64).div(1000).requires_grad_(True)
        y = remap_to_linear(x, plan, rank)
        loss = torch.tanh(y @ w_mlp).pow(2).sum()
        loss.backward()
        ref_x = _token_values(plan, rank, "attention", torch.float64).div(1000).requires_grad_(True)
        torch.tanh(ref_x @ w_mlp).pow(2).sum().backward()
        total = loss.detach().clone()
        dist.all_reduce(total)
        ref_total = sum(torch.tanh(_token_values(plan, r, "attention", torch.float64).div(1000) @ w_mlp)
                        .pow(2).sum() for r in range(world))
        res.append(("grad", k, torch.allclose(x.grad, ref_x.grad, rtol=0, atol=1e-12),
                    float(total), float(ref_total)))

    # Counters: what this rank sends, forward (its moves out) and backward (gradients of its moves in).
    plan = _plans(world)[1]
    counters = CommCounters()
    x = _token_values(plan, rank, "attention", torch.float32).requires_grad_(True)
    remap_to_linear(x, plan, rank, counters=counters).sum().backward()
    topo, row = plan.topology, HIDDEN * 4
    want = {"nvlink": 0, "nic": 0}
    for m in plan.remap:
        if rank in (m.src, m.dst):
            want["nvlink" if topo.same_node(m.src, m.dst) else "nic"] += m.tokens * row
    res.append(("counters", counters.bytes_by_link == want, counters.bytes_by_link, want))

    # Misuse: rows that do not match the plan name the cause.
    try:
        remap_to_linear(torch.zeros(plan.tokens(rank) + 1, 2), _plans(world)[0], rank)
    except RemapLayoutError as e:
        res.append(("error", str(e)))
    return res


def _assert_results(results):
    for per_rank in results:
        for r in per_rank:
            if r[0] == "exact":
                assert r[3] and r[4], r
            elif r[0] == "3d":
                assert r[2], r
            elif r[0] == "adjoint":
                assert r[2] == pytest.approx(r[3], rel=1e-12), r
            elif r[0] == "counters":
                assert r[1], r
            elif r[0] == "grad":
                assert r[2] and r[3] == pytest.approx(r[4], rel=1e-12), r
            else:
                assert "is this the plan of this micro-batch" in r[1]


@pytest.mark.parametrize("world", [2, 4])
def test_remap_layer_round_trip_reference_and_gradients(world):
    _assert_results(run_distributed(_layer_cases, world, timeout=300))


@pytest.mark.slow
def test_remap_layer_world_8():
    _assert_results(run_distributed(_layer_cases, 8, timeout=300))


def test_plans_really_move_tokens():
    for world in TOPOLOGY:
        plans = _plans(world)
        assert plans[0].remap and plans[1].remap and not plans[2].remap
        assert any(p.topology.node_of(m.src) != p.topology.node_of(m.dst) for p in plans[:2] for m in p.remap) \
            or world == 2
