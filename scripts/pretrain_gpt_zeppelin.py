#!/usr/bin/env python
"""Megatron-LM's GPT pre-training with Zeppelin: a caller of the package's entry point, kept for the
documented ``torchrun ... scripts/pretrain_gpt_zeppelin.py ...`` of a source checkout.

The entry is ``megatron_zeppelin.integration.pretrain_gpt`` (``torchrun ... -m
megatron_zeppelin.integration.pretrain_gpt ...``), which a pip install of the package has; its
docstring says what it runs and which flags it needs.
"""

from megatron_zeppelin.integration.pretrain_gpt import main

if __name__ == "__main__":
    main()
