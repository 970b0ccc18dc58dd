"""The simulator's event engine and executor on cases with known answers."""

import numpy as np
import pytest

from megatron_zeppelin.sim.events import TaskGraph
from megatron_zeppelin.sim.executor import Hop, run_step
from megatron_zeppelin.sim.network import LinkTable, fair_rates, fair_shares, pad_links
from megatron_zeppelin.spec.topology import Topology

NV, NIC = 100e9, 10e9  # bytes/s
LAT = {"nvlink": 0.0, "nic": 0.0}


def test_single_transfer_is_latency_plus_bytes_over_bandwidth():
    g = TaskGraph()
    f = g.flow(5e9, (0, 1), latency=2e-6)
    res = g.run(np.array([NV, NV]))
    assert res.end[f] == pytest.approx(2e-6 + 5e9 / NV, rel=1e-12)


def test_shared_bandwidth_halves_throughput():
    one = TaskGraph()
    one.flow(1e9, (0, 1))
    two = TaskGraph()
    a, b = two.flow(1e9, (0, 1)), two.flow(1e9, (0, 2))  # same out-port 0
    caps = np.array([NV, NV, NV])
    t1 = one.run(caps).makespan
    r2 = two.run(caps)
    assert r2.end[a] == pytest.approx(2 * t1) and r2.end[b] == pytest.approx(2 * t1)
    # disjoint ports do not interact
    three = TaskGraph()
    three.flow(1e9, (0, 1)), three.flow(1e9, (2, 3))
    assert three.run(np.array([NV] * 4)).makespan == pytest.approx(t1)


def test_a_finished_flow_releases_its_share():
    g = TaskGraph()
    small, big = g.flow(1e9, (0, 1)), g.flow(3e9, (0, 2))
    res = g.run(np.array([NV, NV, NV]))
    # both at NV/2 until small is done (2e9 moved), then big alone at NV: 0.02 + 2e9/NV
    assert res.end[small] == pytest.approx(0.02)
    assert res.end[big] == pytest.approx(0.04)


def test_progressive_filling_is_max_min_fair():
    rates = fair_rates(np.array([[0, 1], [0, 2], [0, 3]]), np.array([9.0, 9.0, 9.0, 1.0]))
    assert rates.tolist() == pytest.approx([4.0, 4.0, 1.0])


@pytest.mark.parametrize("seed", range(20))
def test_fair_shares_are_fair_rates_bit_for_bit(seed):
    """The event loop's grouped progressive filling gives every flow exactly (==, not approx) the
    rate the per-flow numpy one does: mixed 2- and 4-link flows, repeated link sets, equal
    capacities that saturate together, and capacities of every magnitude."""
    rng = np.random.default_rng(seed)
    nl = int(rng.integers(3, 12))
    cap = rng.choice([1.0, 3.0, 25e9, 50e9, 100e9 / 3], size=nl) * rng.choice([1.0, 1.0, 0.7], size=nl)
    rows = []
    for _ in range(int(rng.integers(1, 40))):
        k = 2 if nl < 4 or rng.random() < 0.7 else 4
        rows.append(tuple(int(x) for x in rng.choice(nl, size=k, replace=False)))
    groups = {}
    for r in rows:
        groups[r] = groups.get(r, 0) + 1
    share = fair_shares(groups, cap.tolist())
    ref = fair_rates(*pad_links(rows, cap))
    assert [share[r] for r in rows] == ref.tolist()


def test_perfect_overlap_compute_hides_transfer():
    g = TaskGraph()
    c = g.delay(1.0)  # compute
    f = g.flow(NV * 0.5, (0, 1))  # 0.5 s transfer, concurrent
    nxt = g.delay(1.0, deps=[c, f])
    assert g.run(np.array([NV, NV])).end[nxt] == pytest.approx(2.0)


def test_routed_message_vs_direct():
    """2 nodes x 4 GPUs, 4 NICs a node; n bytes from rank 0 to rank 4. Direct: one NIC, n / B_nic.
    Routed in 4 pieces (3 dispatched, 4 NICs, 3 combined): 1.5 n / B_nv + n / (4 B_nic), stages in order."""
    topo = Topology(2, 4, 4)
    n = 4e8
    direct = TaskGraph()
    links = LinkTable(topo, NV, NIC)
    e = run_step(direct, links, topo, [Hop("direct", 0, 4, n, "nic", topo.nic_of(0), "x")], {}, LAT)
    t_direct = direct.run(links.capacity).end[e[4]]
    assert t_direct == pytest.approx(n / NIC)
    piece = lambda p: (0, 4, p, p + 1)  # noqa: E731 -- message 0 -> 4, row p
    hops = [Hop("dispatch", 0, p, n / 4, "nvlink", -1, "x", *piece(p)) for p in (1, 2, 3)]
    hops += [Hop("transfer", p, 4 + p, n / 4, "nic", topo.nic_of(p), "x", *piece(p)) for p in range(4)]
    hops += [Hop("combine", 4 + p, 4, n / 4, "nvlink", -1, "x", *piece(p)) for p in (1, 2, 3)]
    routed = TaskGraph()
    e = run_step(routed, links, topo, hops, {}, LAT)
    t_routed = routed.run(links.capacity).end[e[4]]
    assert t_routed == pytest.approx(1.5 * n / NV + n / (4 * NIC))
    assert t_routed < t_direct / 2


def test_stage_waits_for_both_ends():
    """A message starts when both ends have passed their gates."""
    topo = Topology(1, 2)
    g = TaskGraph()
    links = LinkTable(topo, NV, NIC)
    late = g.delay(3.0)
    e = run_step(g, links, topo, [Hop("direct", 0, 1, NV, "nvlink", -1, "x")], {1: [late]}, LAT)
    assert g.run(links.capacity).end[e[0]] == pytest.approx(4.0)
