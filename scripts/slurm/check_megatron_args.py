#!/usr/bin/env python
"""Check rendered SLURM jobs with Megatron-LM's own argument parsing and validation (no GPU needed).

    PYTHON_WITH_MEGATRON_TRAINING scripts/slurm/check_megatron_args.py JOBS.json

JOBS.json is a list of {"name", "mode", "args", "world_size", "env"} and optionally "gpu_arch"
(tests/slurm writes it from ``megatron_zeppelin.slurm.jobs.render_jobs``, tests/megatron_lm from the
lines ``zeppelin advise`` prints and docs/ quotes); run it in the job's environment (``source
megatron_zeppelin/slurm/templates/env.sh`` first), the job's ``env`` is applied for that job only and the environment
restored after it (one job's ``CUDA_DEVICE_MAX_CONNECTIONS=1``, which TP/CP need, must not fail the next
job's Megatron-FSDP, which refuses it). For each job, as rank 0 of ``world_size`` ranks:
``megatron.training.arguments.parse_args`` (with the ``--zeppelin-*`` flags for a Zeppelin job -- mode
zeppelin or ``--zeppelin-balance`` in its flags -- as its entry adds them), ``validate_args``,
``set_global_variables`` without a tokenizer (the micro-batch calculator: ``--global-batch-size`` must
divide by micro-batch x DP) and the TransformerConfig Megatron builds from the flags (its
``__post_init__`` checks e.g. the recompute settings; without Transformer Engine, as on CPU, with the
fused RoPE a GPU machine would have turned off); a Zeppelin job also passes the plugin's own
``validate`` first. Prints one JSON line per job ({"job", "ok", "error"}) and exits 1 if any job fails.

validate_args asks the GPU for its architecture when TP or CP > 1 (``get_device_arch_version``); with
no GPU here it answers the job's "gpu_arch", else ``$ZEPPELIN_CHECK_GPU_ARCH`` (default 9: Hopper, the
H100/H200 the jobs target; 8 is Ampere, the A800).
"""

import json
import os
import sys
import traceback
import typing


def _megatron_training():
    if not hasattr(typing, "override"):  # megatron.training uses typing.override (Python 3.12)
        import typing_extensions
        typing.override = typing_extensions.override
    from megatron.training import arguments, global_vars
    import torch
    if not torch.cuda.is_available():
        arguments.get_device_arch_version = lambda: int(os.environ.get("ZEPPELIN_CHECK_GPU_ARCH", "9"))
    return arguments, global_vars


def is_zeppelin(job) -> bool:
    return job["mode"] == "zeppelin" or "--zeppelin-balance" in job["args"]


def check(job, arguments, global_vars) -> str:
    """'' if Megatron (and, for a Zeppelin job, the plugin) accepts the job's flags, else the error.
    The environment is the caller's again afterwards."""
    saved = dict(os.environ)
    try:
        os.environ.update({k: str(v) for k, v in job.get("env", {}).items()})
        os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", str(job["world_size"])
        if "gpu_arch" in job:
            os.environ["ZEPPELIN_CHECK_GPU_ARCH"] = str(job["gpu_arch"])
        return _check(job, arguments, global_vars)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _check(job, arguments, global_vars) -> str:
    sys.argv = ["pretrain_gpt.py", *job["args"]]
    provider = None
    if is_zeppelin(job):
        from megatron_zeppelin.integration.megatron_lm import extra_args_provider
        provider = extra_args_provider  # what scripts/pretrain_gpt_zeppelin.py passes
    try:
        args = arguments.parse_args(extra_args_provider=provider)
        arguments.validate_args(args, {})
        global_vars.set_global_variables(args, build_tokenizer=False)
        if is_zeppelin(job):
            from megatron_zeppelin.integration.megatron_lm import validate
            validate(args)
        import importlib.util
        from megatron.training.argument_utils import core_transformer_config_from_args
        if importlib.util.find_spec("transformer_engine") is None:
            # a GPU fact on CPU: Megatron's default fused RoPE needs Transformer Engine, which a GPU
            # machine has and this one cannot install (the flags chose nothing here)
            args.apply_rope_fusion = False
        core_transformer_config_from_args(args)
        return ""
    except SystemExit as e:  # argparse: an unknown or malformed flag
        return f"argparse rejected the flags (exit {e.code})"
    except BaseException as e:  # noqa: BLE001 - Megatron validates with bare asserts
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return f"{type(e).__name__}: {e} ({os.path.basename(tb.filename)}:{tb.lineno})"
    finally:
        global_vars.unset_global_variables()


def main() -> int:
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    arguments, global_vars = _megatron_training()
    bad = 0
    for job in jobs:
        err = check(job, arguments, global_vars)
        bad += bool(err)
        print(json.dumps({"job": f"{job['name']}-{job['mode']}", "ok": not err, "error": err}), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
