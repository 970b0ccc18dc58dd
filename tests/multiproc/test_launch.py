"""The launcher never hangs and names the rank that caused a failure: an exception with its traceback,
a signal or exit code with the rank's pid, a hang with the rank's last progress marker."""

import signal
import time

import pytest
import torch
import torch.distributed as dist

from fault_workers import die, kill_launcher
from megatron_zeppelin.distributed.launch import DistributedFailure, run_distributed


def _sum_ranks(rank, world):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item()


def _fail_on_one(rank, world):
    if rank == 1:
        raise RuntimeError("boom on rank one")
    dist.barrier()  # rank 0 blocks here until it is terminated
    return rank


def test_results_in_rank_order():
    assert run_distributed(_sum_ranks, 3, timeout=120) == [3.0, 3.0, 3.0]


def test_failing_rank_raises_with_traceback():
    with pytest.raises(DistributedFailure, match="boom on rank one") as e:
        run_distributed(_fail_on_one, 2, timeout=120)
    d = e.value.diagnosis
    assert (d.rank, d.kind) == (1, "exception")
    assert str(e.value).startswith("rank 1 (pid ")


def _user_error(rank, world):
    from megatron_zeppelin.errors import ZeppelinError
    if rank == 0:
        raise ZeppelinError("--some-flag is wrong: set it to 3")
    dist.barrier()


def test_user_error_comes_back_as_itself():
    from megatron_zeppelin.errors import ZeppelinError
    with pytest.raises(ZeppelinError, match="--some-flag is wrong"):
        run_distributed(_user_error, 2, timeout=120)


@pytest.mark.parametrize("how,kind,first", [
    ("kill9", "signal", "rank 2 (pid {pid}) killed by signal 9 (SIGKILL)"),
    ("exit3", "exit", "rank 2 (pid {pid}) exited with code 3"),
])
def test_a_dead_rank_is_named_before_its_peers_errors(how, kind, first):
    with pytest.raises(DistributedFailure) as e:
        run_distributed(die, 3, 2, how, timeout=120)
    d = e.value.diagnosis
    assert (d.rank, d.kind) == (2, kind), str(e.value)
    pid = str(e.value).split("(pid ", 1)[1].split(")", 1)[0]
    assert str(e.value).startswith(first.format(pid=pid)), str(e.value)
    assert "last entered barrier at fault_workers.py" in d.headline  # its last collective


def test_a_hung_rank_is_named_with_where_it_stopped():
    with pytest.raises(DistributedFailure) as e:
        run_distributed(die, 3, 1, "hang", timeout=30)
    d = e.value.diagnosis
    assert (d.rank, d.kind) == (1, "hang"), str(e.value)
    assert "rank 1 (pid" in d.headline and "stopped making progress" in d.headline
    assert "last entered barrier at fault_workers.py" in d.headline and "(die)" in d.headline
    # the peers were further on: in the all_reduce the hung rank never entered
    assert all("rank 1" not in o for o in d.others)


def _stuck_in_a_phase(rank, world):
    from megatron_zeppelin.distributed import progress
    dist.barrier()
    if rank == 1:
        progress.mark_step(7)
        progress.mark("saving checkpoint")
        time.sleep(3600)
    dist.barrier()


@pytest.mark.slow  # ~40 s (a 30 s hang window); the hung rank above is named in the default run
def test_step_and_phase_markers_name_where_a_rank_stopped():
    with pytest.raises(DistributedFailure) as e:
        run_distributed(_stuck_in_a_phase, 2, timeout=30)
    d = e.value.diagnosis
    assert (d.rank, d.kind) == (1, "hang"), str(e.value)
    assert "step 7, in saving checkpoint, last entered barrier at test_launch.py" in d.headline


@pytest.mark.parametrize("sig,rc", [(signal.SIGTERM, 128 + 15), (signal.SIGKILL, -9)])
def test_ranks_die_with_their_launcher(tmp_path, sig, rc):
    r = kill_launcher(str(tmp_path), 2, sig)
    assert r["seconds"] is not None, f"ranks {r['pids']} outlived the launcher by 60s: {r['output'][-2000:]}"
    assert r["rc"] == rc, r["output"][-2000:]
