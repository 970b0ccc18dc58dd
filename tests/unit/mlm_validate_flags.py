"""Run by tests/unit/test_advise_megatron.py under the Megatron-LM interpreter (.venv-mlm, megatron-core
0.19.2 with megatron/training): for each flag line (a JSON list on stdin of {"flags", "env"}), parse it
with Megatron's own parser, validate it with validate_args, and build the TransformerConfig (whose
__post_init__ checks the recompute settings). Prints one JSON result per line.

Stand-in for what a CPU machine cannot answer: the GPU architecture (env GPU_ARCH: 8 = A800,
9 = H200), which validate_args reads from CUDA. WORLD_SIZE is the job's GPU count.
"""

import json
import os
import sys
import traceback
import typing


def main() -> None:
    import typing_extensions

    typing.override = typing_extensions.override  # Megatron-LM uses typing.override (Python 3.12)

    import megatron.training.arguments as A
    from megatron.training.argument_utils import core_transformer_config_from_args

    from megatron_zeppelin.integration.args import add_zeppelin_args

    A.get_device_arch_version = lambda: int(os.environ.get("GPU_ARCH", "9"))
    base_env = dict(os.environ)
    for job in json.load(sys.stdin):
        os.environ.clear()
        os.environ.update(base_env)
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        os.environ.update(job["env"])
        flags = job["flags"]
        sys.argv = ["pretrain_gpt.py"] + flags
        try:
            args = A.parse_args(extra_args_provider=add_zeppelin_args if "--zeppelin-balance" in flags else None)
            A.validate_args(args, {})
            cfg = core_transformer_config_from_args(args)
            out = {"ok": True, "dp": args.data_parallel_size, "recompute": cfg.recompute_granularity,
                   "method": cfg.recompute_method, "distopt": args.use_distributed_optimizer}
        except (Exception, SystemExit) as e:  # argparse exits; validation asserts or raises
            out = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
        print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":  # only under the Megatron-LM interpreter; pytest's doctest import is harmless
    main()
