"""--zeppelin-plan-sharing: the flag, its default (one-per-domain with plan-ahead, every-rank
without), the typed config field and its error naming the flag; the sharing objects pickle as None
(Megatron saves its args, where the run keeps them, in each checkpoint)."""

import argparse
import pickle

import pytest

from megatron_zeppelin.integration.args import add_zeppelin_args, config_from_args
from megatron_zeppelin.integration.plan_share import ShareGroup
from megatron_zeppelin.spec.config import ConfigError, PlanSharing, ZeppelinConfig


def _cfg(*flags):
    return config_from_args(add_zeppelin_args(argparse.ArgumentParser()).parse_args(list(flags)))


def test_the_flag_and_its_default():
    assert _cfg().plan_sharing is PlanSharing.ONE_PER_DOMAIN
    assert _cfg("--no-zeppelin-plan-ahead").plan_sharing is PlanSharing.EVERY_RANK
    assert _cfg("--zeppelin-plan-sharing", "every-rank").plan_sharing is PlanSharing.EVERY_RANK
    assert _cfg("--no-zeppelin-plan-ahead", "--zeppelin-plan-sharing", "one-per-domain").plan_sharing \
        is PlanSharing.ONE_PER_DOMAIN
    with pytest.raises(SystemExit):
        _cfg("--zeppelin-plan-sharing", "one-per-node")


def test_the_config_field_is_typed_and_names_the_flag():
    assert ZeppelinConfig(plan_sharing="every-rank").plan_sharing is PlanSharing.EVERY_RANK
    with pytest.raises(ConfigError, match="set --zeppelin-plan-sharing to one of every-rank, one-per-domain"):
        ZeppelinConfig(plan_sharing="rank-0")


def test_megatron_can_save_the_args_that_hold_the_group():
    args = argparse.Namespace(seed=1, _zeppelin_share_group=ShareGroup(object(), [0, 1], 0, 60.0))
    assert pickle.loads(pickle.dumps(args)) == argparse.Namespace(seed=1, _zeppelin_share_group=None)
