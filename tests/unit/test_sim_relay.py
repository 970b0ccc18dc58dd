"""Routed relays in the simulator progress as the runtime's relay thread does (distributed/executor.py)."""

import pytest

from megatron_zeppelin.sim.events import TaskGraph
from megatron_zeppelin.sim.executor import Hop, reverse_hops, run_step
from megatron_zeppelin.sim.network import LinkTable
from megatron_zeppelin.spec.topology import Topology

NV, NIC = 100e9, 10e9  # bytes/s
LAT = {"nvlink": 0.0, "nic": 0.0}
N = 1e9  # bytes of the routed message
TOPO = Topology(2, 2, 2)  # ranks 0, 1 on node 0; 2, 3 on node 1; one NIC per GPU


def routed(n=N):
    """Message 0 -> 3, rows [0, 10) through proxy 1 (dispatch over NVLink, transfer on NIC 1)."""
    return [Hop("dispatch", 0, 1, n, "nvlink", -1, "ring_inter", 0, 3, 0, 10, (0, 0)),
            Hop("transfer", 1, 3, n, "nic", TOPO.nic_of(1), "ring_inter", 0, 3, 0, 10, (0, 0))]


def test_busy_proxy_does_not_delay_the_message_nor_wait_for_it():
    g, links = TaskGraph(), LinkTable(TOPO, NV, NIC)
    end = run_step(g, links, TOPO, routed(), {}, LAT)
    busy = g.delay(5.0, [end[1]])  # the proxy computes right after posting
    after = g.delay(1.0, [end[3]])  # the destination's next kernel uses the message
    res = g.run(links.capacity)
    arrive = N / NV + N / NIC
    assert res.end[end[3]] == pytest.approx(arrive)
    assert res.end[end[1]] == pytest.approx(0.0)  # a pure proxy's wait() waits for nothing
    assert res.end[busy] == pytest.approx(5.0)  # ... so its compute starts at once
    assert res.end[after] == pytest.approx(arrive + 1.0)
    assert res.end[end[0]] == pytest.approx(N / NV)  # the source waits for its own send only


def test_relay_not_held_by_the_proxys_own_sends():
    """The proxy also sends a 20x larger direct message; the relay still forwards on arrival (no
    stage barrier on the proxy), and the proxy's own wait() covers its own message."""
    g, links = TaskGraph(), LinkTable(TOPO, NV, NIC)
    hops = routed() + [Hop("direct", 1, 0, 20 * N, "nvlink", -1, "remap")]
    end = run_step(g, links, TOPO, hops, {}, LAT)
    res = g.run(links.capacity)
    assert res.end[end[3]] == pytest.approx(N / NV + N / NIC)
    assert res.end[end[1]] == pytest.approx(20 * N / NV)
    assert res.end[end[0]] == pytest.approx(20 * N / NV)


def test_relay_waits_for_its_rows_and_posts_in_order():
    """Each relayed transfer leaves when its own rows are at the proxy, and the relay posts its
    forwards in order: piece B (rows 5-9 of another message between the same ends, arrives first)
    leaves after piece A (rows 0-4). A piece sent by the source on its own NIC does not wait for any
    dispatch. (Two ops of one message on one hop would be one piece's chunks, which pass the hop one
    after the other: test_chunks_pipeline_the_stages.)"""
    g, links = TaskGraph(), LinkTable(TOPO, NV, NIC)
    a, b = (0, 3, 0, 5, (0, 0)), (0, 3, 5, 10, (0, 1))
    hops = [Hop("dispatch", 0, 1, 4 * N, "nvlink", -1, "x", *a),
            Hop("dispatch", 0, 1, N / 10, "nvlink", -1, "x", *b),
            Hop("transfer", 1, 3, N, "nic", TOPO.nic_of(1), "x", *a),
            Hop("transfer", 1, 3, N, "nic", TOPO.nic_of(1), "x", *b),
            Hop("transfer", 0, 2, N, "nic", TOPO.nic_of(0), "x", 0, 3, 10, 20, (0, 0)),
            Hop("combine", 2, 3, N, "nvlink", -1, "x", 0, 3, 10, 20, (0, 0))]
    run_step(g, links, TOPO, hops, {}, LAT)
    res = g.run(links.capacity)
    flows = {g.tag[i][2]: [k for k in range(len(g)) if g.tag[k] == g.tag[i]] for i in range(len(g)) if g.tag[i]}
    disp_a, disp_b = flows["dispatch 0->1"]
    tr_a, tr_b = flows["transfer 1->3"]
    assert res.end[disp_b] == pytest.approx(2 * (N / 10) / NV)  # B arrives first (shared port)
    assert res.start[tr_a] == pytest.approx(res.end[disp_a]) == res.start[tr_b]  # in relay order
    own = flows["transfer 0->2"][0]
    assert res.start[own] == pytest.approx(0.0)
    assert res.start[flows["combine 2->3"][0]] == pytest.approx(N / NIC)


def test_chunks_pipeline_the_stages():
    """A piece cut into 4 chunks (rows 0-10: 3, 3, 2, 2): each chunk passes a hop after the one before
    it, and the proxy forwards chunk i while chunk i+1 is dispatched, so the message arrives after
    one chunk's dispatch plus the whole transfer (the NIC is the slower stage), not after both whole."""
    g, links = TaskGraph(), LinkTable(TOPO, NV, NIC)
    cuts = [(0, 3), (3, 6), (6, 8), (8, 10)]
    hops = [Hop(st, s, d, N * (b - a) / 10, link, nic, "ring_inter", 0, 3, a, b, (0, 0))
            for st, s, d, link, nic in (("dispatch", 0, 1, "nvlink", -1), ("transfer", 1, 3, "nic", TOPO.nic_of(1)))
            for a, b in cuts]
    end = run_step(g, links, TOPO, hops, {}, LAT)
    res = g.run(links.capacity)
    flows = sorted((g.tag[i][2], res.start[i], res.end[i]) for i in range(len(g)) if g.tag[i])
    dispatch = [(s, e) for name, s, e in flows if name.startswith("dispatch")]
    transfer = [(s, e) for name, s, e in flows if name.startswith("transfer")]
    for (_, e0), (s1, _) in zip(dispatch, dispatch[1:]):
        assert s1 == pytest.approx(e0)  # one after the other on the hop
    assert transfer[0][0] == pytest.approx(dispatch[0][1])  # chunk 0 leaves as chunk 1 is dispatched
    assert res.end[end[3]] == pytest.approx(0.3 * N / NV + N / NIC)
    assert res.end[end[3]] < N / NV + N / NIC  # the unpipelined time


def test_direct_step_unchanged_and_reverse_keeps_the_message():
    """Unrouted: both ends post, the message takes bytes / bandwidth; a reversed routed message is the
    mirror (combine <- dispatch, ends swapped) and is relayed the same way."""
    g, links = TaskGraph(), LinkTable(TOPO, NV, NIC)
    late = g.delay(2.0)
    end = run_step(g, links, TOPO, [Hop("direct", 0, 2, N, "nic", TOPO.nic_of(0), "x")], {2: [late]}, LAT)
    res = g.run(links.capacity)
    assert res.end[end[0]] == pytest.approx(2.0 + N / NIC) == res.end[end[2]]
    back = reverse_hops(routed(), TOPO)
    assert [(h.stage, h.src, h.dst, h.msg_src, h.msg_dst) for h in back] == \
        [("combine", 1, 0, 3, 0), ("transfer", 3, 1, 3, 0)]
    g, links = TaskGraph(), LinkTable(TOPO, NV, NIC)
    end = run_step(g, links, TOPO, back, {}, LAT)
    res = g.run(links.capacity)
    assert res.end[end[0]] == pytest.approx(N / NIC + N / NV)
    assert res.end[end[1]] == pytest.approx(0.0)


def test_relaying_rows_never_received_is_an_error():
    g, links = TaskGraph(), LinkTable(TOPO, NV, NIC)
    with pytest.raises(ValueError, match="never reached rank 1"):
        run_step(g, links, TOPO, routed()[1:], {}, LAT)
