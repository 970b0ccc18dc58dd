"""The launcher never hangs: results come back, a failing rank raises with its traceback."""

import pytest
import torch
import torch.distributed as dist

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
    assert run_distributed(_sum_ranks, 3, timeout=60) == [3.0, 3.0, 3.0]


def test_failing_rank_raises_with_traceback():
    with pytest.raises(DistributedFailure, match="boom on rank one"):
        run_distributed(_fail_on_one, 2, timeout=30)


def _user_error(rank, world):
    from megatron_zeppelin.errors import ZeppelinError
    if rank == 0:
        raise ZeppelinError("--some-flag is wrong: set it to 3")
    dist.barrier()


def test_user_error_comes_back_as_itself():
    from megatron_zeppelin.errors import ZeppelinError
    with pytest.raises(ZeppelinError, match="--some-flag is wrong"):
        run_distributed(_user_error, 2, timeout=30)
