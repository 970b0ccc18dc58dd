"""The Megatron-LM entry points the package ships, by module name.

They run as ``python -m MODULE`` or ``torchrun ... -m MODULE``, so a wheel install has them (the
scripts/ of a source checkout are not installed). ``zeppelin slurm`` jobs and advise's command lines
name them from here: the modules are in integration/, the only package that imports megatron, and
this leaf names them without importing it.

>>> import importlib.util
>>> [importlib.util.find_spec(m) is not None for m in (ZEPPELIN_ENTRY, PACKED_ENTRY)]
[True, True]
>>> " ".join(launch_args(ZEPPELIN_ENTRY))
'-m megatron_zeppelin.integration.pretrain_gpt'
"""

from __future__ import annotations

from typing import List

# Megatron-LM's pretrain() with the --zeppelin-* flags, the Zeppelin layer spec and the document batches
ZEPPELIN_ENTRY = "megatron_zeppelin.integration.pretrain_gpt"
# stock GPT pre-training on packed samples (pretrain_gpt.py's GPT path) for megatron.training without a checkout
PACKED_ENTRY = "megatron_zeppelin.integration.pretrain_gpt_packed"


def launch_args(module: str) -> List[str]:
    """What follows the interpreter (or torchrun's options) to run an entry module."""
    return ["-m", module]
