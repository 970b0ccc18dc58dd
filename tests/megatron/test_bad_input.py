"""Bad input fails with a clear error naming what to change, and never hangs."""

import argparse

import pytest
import torch

from megatron_zeppelin.spec.config import ConfigError, ZeppelinConfig
from megatron_zeppelin.distributed.launch import run_distributed
from megatron_zeppelin.integration.args import add_zeppelin_args, config_from_args
from megatron_zeppelin.planner import plan_batch
from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE
from megatron_zeppelin.planner.types import PlanError
from megatron_zeppelin.spec.topology import Topology


def _args(*argv, **megatron):
    a = add_zeppelin_args(argparse.ArgumentParser()).parse_args(["--zeppelin-balance", *argv])
    for k, v in megatron.items():
        setattr(a, k, v)
    return a


@pytest.mark.parametrize("megatron,flag", [
    ({"context_parallel_size": 2}, "--context-parallel-size"),
    ({"overlap_moe_expert_parallel_comm": True}, "--overlap-moe-expert-parallel-comm"),
    ({"num_microbatches_with_partial_activation_checkpoints": 2}, "--num-microbatches-with-partial-activation"),
    ({"sequence_parallel": True}, "--sequence-parallel"),
    ({"num_experts": 8, "moe_token_dispatcher_type": "flex"}, "--moe-token-dispatcher-type"),
    ({"apply_rope_fusion": True}, "--no-rope-fusion"),
])
def test_unsupported_megatron_settings_name_the_flag(megatron, flag):
    with pytest.raises(ConfigError, match=flag):
        config_from_args(_args(**megatron))


def test_sequence_parallel_is_accepted_with_tensor_parallelism():
    c = config_from_args(_args(tensor_model_parallel_size=2, sequence_parallel=True))
    assert (c.tp, c.sequence_parallel) == (2, True)


def test_flags_round_trip_and_without_balance_nothing_is_refused():
    c = config_from_args(_args("--zeppelin-strategy", "static_cp", "--zeppelin-cp-size", "4",
                                "--no-zeppelin-remap", tensor_model_parallel_size=2))
    assert (c.strategy, c.cp_size, c.remap, c.tp, c.balance) == ("static_cp", 4, False, 2, True)
    a = add_zeppelin_args(argparse.ArgumentParser()).parse_args([])
    a.context_parallel_size = 4
    assert config_from_args(a).balance is False
    with pytest.raises(ConfigError, match="--zeppelin-cp-size"):
        config_from_args(_args("--zeppelin-cp-size", "3"))


def test_missing_or_broken_dataset_is_a_clear_error(tmp_path):
    from megatron_zeppelin.integration.data import DataError, DocumentDataset
    with pytest.raises(DataError, match="--data-path .*does not exist"):
        DocumentDataset(str(tmp_path / "nope"))
    (tmp_path / "junk.bin").write_bytes(b"x" * 10)
    (tmp_path / "junk.idx").write_bytes(b"not an index")
    with pytest.raises(DataError, match="not a Megatron indexed dataset"):
        DocumentDataset(str(tmp_path / "junk"))


def test_batch_that_does_not_match_the_plan():
    from megatron_zeppelin.integration.batch import check_docs
    plan = plan_batch([5, 3], Topology(1, 2), TOY_PROFILE, TOY_MODEL, ZeppelinConfig(gpus_per_node=2),
                      strategy="packed_dp")
    check_docs([torch.zeros(6), torch.zeros(4)], plan)
    with pytest.raises(PlanError, match="plan the batch you train on"):
        check_docs([torch.zeros(6), torch.zeros(5)], plan)


def _disagree(rank, world):
    from megatron_zeppelin.integration.plan_check import PlanMismatchError, check_plan_agreement
    lengths = [7, 3, 5] if rank == 0 else [7, 3, 6]  # rank 1 read a different batch
    plan = plan_batch(lengths, Topology(1, 2), TOY_PROFILE, TOY_MODEL, ZeppelinConfig(gpus_per_node=2),
                      strategy="packed_dp")
    try:
        check_plan_agreement(plan)
    except PlanMismatchError as e:
        return str(e)
    return None


def _agree(rank, world):
    from megatron_zeppelin.integration.plan_check import check_plan_agreement
    plan = plan_batch([7, 3, 5], Topology(1, 2), TOY_PROFILE, TOY_MODEL, ZeppelinConfig(gpus_per_node=2),
                      strategy="packed_dp")
    check_plan_agreement(plan)
    return plan.digest()


def test_ranks_that_disagree_on_the_plan_all_fail_clearly():
    msgs = run_distributed(_disagree, 2, timeout=300)
    assert all(m is not None and "plan.lengths" in m and "ranks disagree on the plan" in m for m in msgs)
    d = run_distributed(_agree, 2, timeout=300)
    assert d[0] == d[1]
