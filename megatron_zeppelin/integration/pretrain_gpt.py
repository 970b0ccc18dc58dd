"""Megatron-LM's GPT pre-training with Zeppelin, without patching Megatron-LM: the plugin's entry point.

Needs ``megatron.training`` (megatron-core >= 0.19 ships it; or a Megatron-LM checkout, the commit
named in patches/README.md, on PYTHONPATH or in MEGATRON_LM) and megatron_zeppelin installed. It is
a module of the package, so a wheel install has it; run it under torchrun or SLURM:

    torchrun --nnodes 2 --nproc-per-node 8 ... -m megatron_zeppelin.integration.pretrain_gpt \\
        <the usual pretrain_gpt.py flags> --position-embedding-type rope \\
        --zeppelin-balance --zeppelin-gpus-per-node 8 --zeppelin-cluster h200 \\
        --calculate-per-token-loss --dataloader-type external --data-path PREFIX --split 98,2,0

(``scripts/pretrain_gpt_zeppelin.py`` of a source checkout calls :func:`main`.)

It is Megatron-LM's own ``pretrain(...)`` with ``extra_args_provider`` adding the ``--zeppelin-*``
flags, the Zeppelin layer spec (``--spec megatron_zeppelin.integration.megatron_lm
zeppelin_layer_spec``), the whole-document data iterators (train and validation) and the planned
forward step. ``--zeppelin-stock-spec`` instead trains Megatron's stock spec on the same documents
(the reference). Without either flag it is stock pretrain_gpt.py, which needs the checkout.
On a machine without CUDA, integration/cpu_megatron_lm.py's shim is installed first (gloo ranks).

megatron is imported inside the functions, never when this module is imported: the shim must patch
torch before ``megatron.training`` is imported, a MEGATRON_LM checkout must be on ``sys.path`` before
any megatron module is, and importing the package (its doctests, a layer check) must neither patch
torch nor need ``megatron.training`` (megatron-core < 0.19 has none).
"""

import os
import sys

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.integration import megatron_lm as zeppelin_lm

PROG = "megatron_zeppelin.integration.pretrain_gpt"  # as errors name this entry


def prepare() -> None:
    """What must precede the first megatron import: the MEGATRON_LM checkout first on ``sys.path``,
    then the CPU shim (a no-op where CUDA exists)."""
    if os.environ.get("MEGATRON_LM"):
        sys.path.insert(0, os.environ["MEGATRON_LM"])
    from megatron_zeppelin.integration import cpu_megatron_lm  # imports megatron.core: after the path

    cpu_megatron_lm.install()


def _stock():
    try:
        import pretrain_gpt  # Megatron-LM's, from the checkout
    except ImportError:
        sys.exit(f"{PROG}: without --zeppelin-balance or --zeppelin-stock-spec this is stock "
                 "pretrain_gpt.py: set MEGATRON_LM to a Megatron-LM checkout")
    return pretrain_gpt


def forward_step(data_iterator, model, return_schedule_plan: bool = False):
    from megatron.training import get_args  # imported by main() already, after prepare()

    if zeppelin_lm.uses_documents(get_args()):
        return zeppelin_lm.forward_step(data_iterator, model)
    return _stock().forward_step(data_iterator, model, return_schedule_plan)


def datasets_provider(train_val_test_num_samples, vp_stage=None):
    from megatron.training import get_args  # imported by main() already, after prepare()

    if zeppelin_lm.uses_documents(get_args()):
        return zeppelin_lm.train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage)
    return _stock().train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage)


datasets_provider.is_distributed = True


def main():
    prepare()
    from megatron.core.enums import ModelType
    from megatron.training import pretrain
    from megatron.training.argument_utils import gpt_config_from_args, pretrain_cfg_container_from_args
    from megatron.training.arguments import parse_and_validate_args

    args = parse_and_validate_args(extra_args_provider=zeppelin_lm.extra_args_provider,
                                   args_defaults={"tokenizer_type": "GPT2BPETokenizer"})
    kwargs = {}
    zeppelin_lm.use_prebuilt_dataset_helpers()
    if zeppelin_lm.uses_documents(args):
        try:
            zeppelin_lm.validate(args)
        except ZeppelinError as e:
            sys.exit(f"{PROG}: error: {e}")
    else:
        kwargs["get_embedding_ranks"] = _stock().get_embedding_ranks
    full_config = pretrain_cfg_container_from_args(args, gpt_config_from_args(args))
    pretrain(full_config, datasets_provider, ModelType.encoder_or_decoder, forward_step, **kwargs)
    zeppelin_lm.shutdown()


if __name__ == "__main__":
    main()
