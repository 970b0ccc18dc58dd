"""StepExchange.wait() on a proxy waits for this rank's own messages only, not for the pieces it
relays, the last hop of a routed message (the combine, whose destination is the message's) included.

World 4 as 2 nodes x 2: one 4-row message from rank 0 to rank 2, routed dispatch 0 -> 1, transfer
1 -> 3, combine 3 -> 2; and the same ops mirrored (``reverse``, gradients going home: 2 -> 3 -> 1 ->
0, whose last hop rank 1 relays). The message's source holds back its start() until the proxy of
the last hop says its wait() returned: a wait() that joins its relay would be blocked on that very
message, so the source gives up after HOLD_S, sends anyway (nothing hangs), and reports it. No timing
is asserted: only the order (the proxy returned before the message left) and the data.
"""

import datetime
import os

import torch
import torch.distributed as dist

from megatron_zeppelin.distributed.executor import StepExchange
from megatron_zeppelin.distributed.launch import run_distributed
from megatron_zeppelin.distributed.tags import ExchangeTags
from megatron_zeppelin.planner.types import CommOp

HOLD_S = 20.0  # how long the source waits for the proxy's word before sending anyway
ROWS, WIDTH = 4, 3


def routed_ops():
    nb = ROWS * WIDTH * 8
    def hop(src, dst, link, nic, stage):  # rows [0, ROWS) of ring 0's block 0, from rank 0 to rank 2
        return CommOp("inter", 0, 0, 0, 0, 2, src, dst, 0, ROWS, nb, link, nic, stage)
    return [hop(0, 1, "nvlink", -1, "dispatch"), hop(1, 3, "nic", 1, "transfer"), hop(3, 2, "nvlink", -1, "combine")]


def _body(rank, world):
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    data = torch.arange(ROWS * WIDTH, dtype=torch.float64).view(ROWS, WIDTH)
    tags, out = ExchangeTags(), {}
    # (direction, the message's source, the proxy forwarding its last hop, its destination)
    for name, reverse, src, last_proxy, dst in (("fwd", False, 0, 3, 2), ("rev", True, 2, 1, 0)):
        key = f"edges/{name}/proxy-returned"
        pay = {(0, 0): data} if rank == src else {}
        ex = StepExchange(routed_ops(), rank, dist.group.WORLD, pay, WIDTH, dtype=torch.float64,
                          reverse=reverse, tags=tags)
        if rank == src:  # hold the message back until the last hop's proxy returned from wait()
            try:
                store.wait([key], datetime.timedelta(seconds=HOLD_S))
                out[name + "_proxy_first"] = True
            except RuntimeError:  # the proxy is still in wait(): send anyway, so that it can finish
                out[name + "_proxy_first"] = False
        got = ex.start().wait()
        if rank == last_proxy:
            store.set(key, "1")
        if rank == dst:
            out[name + "_data"] = got[(0, 0, src)].tolist()
        dist.barrier()
    tags.drain()
    return out


def test_proxy_wait_does_not_join_its_relays():
    res = run_distributed(_body, 4, timeout=120)
    assert res[0]["fwd_proxy_first"], "rank 3's wait() waited for the combine hop it relays"
    assert res[2]["rev_proxy_first"], "rank 1's wait() waited for the last hop it relays (mirrored ops)"
    want = torch.arange(ROWS * WIDTH, dtype=torch.float64).view(ROWS, WIDTH).tolist()
    assert res[2]["fwd_data"] == want and res[0]["rev_data"] == want
