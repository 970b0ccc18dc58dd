#!/usr/bin/env python
"""Megatron-LM's GPT pre-training with Zeppelin, without patching Megatron-LM.

Run it from (or point MEGATRON_LM at) a Megatron-LM checkout of the commit named in
patches/README.md, with megatron_zeppelin installed, under torchrun or SLURM:

    MEGATRON_LM=/path/to/Megatron-LM torchrun --nnodes 2 --nproc-per-node 8 ... \\
        scripts/pretrain_gpt_zeppelin.py <the usual pretrain_gpt.py flags> \\
        --zeppelin-balance --zeppelin-gpus-per-node 8 --zeppelin-cluster h200 \\
        --calculate-per-token-loss --dataloader-type external --data-path PREFIX

It is Megatron-LM's own ``pretrain(...)`` with ``extra_args_provider`` adding the ``--zeppelin-*``
flags, the Zeppelin layer spec (``--spec megatron_zeppelin.integration.megatron_lm
zeppelin_layer_spec`` unless another is given), the whole-document data iterator and the planned
forward step. Without ``--zeppelin-balance`` it is stock pretrain_gpt.py.
"""

import os
import sys

sys.path.insert(0, os.environ.get("MEGATRON_LM", os.getcwd()))

import pretrain_gpt as base  # noqa: E402  (Megatron-LM's, from the checkout above)
from megatron.core.enums import ModelType  # noqa: E402
from megatron.training import get_args, pretrain  # noqa: E402
from megatron.training.argument_utils import gpt_config_from_args, pretrain_cfg_container_from_args  # noqa: E402
from megatron.training.arguments import parse_and_validate_args  # noqa: E402

from megatron_zeppelin.integration import megatron_lm as zeppelin_lm  # noqa: E402


def forward_step(data_iterator, model, return_schedule_plan: bool = False):
    if getattr(get_args(), "zeppelin_balance", False):
        return zeppelin_lm.forward_step(data_iterator, model)
    return base.forward_step(data_iterator, model, return_schedule_plan)


def datasets_provider(train_val_test_num_samples, vp_stage=None):
    if getattr(get_args(), "zeppelin_balance", False):
        return zeppelin_lm.train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage)
    return base.train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage)


datasets_provider.is_distributed = True


def main():
    args = parse_and_validate_args(extra_args_provider=zeppelin_lm.extra_args_provider,
                                   args_defaults={"tokenizer_type": "GPT2BPETokenizer"})
    if getattr(args, "zeppelin_balance", False):
        zeppelin_lm.validate(args)
        if args.spec is None:
            args.spec = ["megatron_zeppelin.integration.megatron_lm", "zeppelin_layer_spec"]
    full_config = pretrain_cfg_container_from_args(args, gpt_config_from_args(args))
    pretrain(full_config, datasets_provider, ModelType.encoder_or_decoder, forward_step,
             get_embedding_ranks=base.get_embedding_ranks)


if __name__ == "__main__":
    main()
