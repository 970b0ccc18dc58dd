#!/usr/bin/env python
"""Check rendered SLURM jobs with Megatron-LM's own argument parsing and validation (no GPU needed).

    PYTHON_WITH_MEGATRON_TRAINING scripts/slurm/check_megatron_args.py JOBS.json

JOBS.json is a list of {"name", "mode", "args", "world_size", "env"} (tests/slurm writes it from
``megatron_zeppelin.slurm.jobs.render_jobs``); run it in the job's environment (``source
megatron_zeppelin/slurm/templates/env.sh`` first), the matrix's ``env`` is applied per job. For each job, as rank 0 of
``world_size`` ranks:
``megatron.training.arguments.parse_args`` (with the ``--zeppelin-*`` flags only for the zeppelin
job, as its entry adds them), ``validate_args``, and ``set_global_variables`` without a tokenizer (the
micro-batch calculator: ``--global-batch-size`` must divide by micro-batch x DP); the zeppelin job
also passes the plugin's own ``validate``. Prints one JSON line per job ({"job", "ok", "error"}) and
exits 1 if any job fails.

validate_args asks the GPU for its architecture when TP or CP > 1 (``get_device_arch_version``); with
no GPU here it answers ``$ZEPPELIN_CHECK_GPU_ARCH`` (default 9: Hopper, the H100/H200 the jobs target).
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
        arch = int(os.environ.get("ZEPPELIN_CHECK_GPU_ARCH", "9"))
        arguments.get_device_arch_version = lambda: arch
    return arguments, global_vars


def check(job, arguments, global_vars) -> str:
    """'' if Megatron (and, for zeppelin, the plugin) accepts the job's flags, else the error."""
    os.environ.update({k: str(v) for k, v in job.get("env", {}).items()})
    os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", str(job["world_size"])
    sys.argv = ["pretrain_gpt.py", *job["args"]]
    provider = None
    if job["mode"] == "zeppelin":
        from megatron_zeppelin.integration.megatron_lm import extra_args_provider
        provider = extra_args_provider  # what scripts/pretrain_gpt_zeppelin.py passes
    try:
        args = arguments.parse_args(extra_args_provider=provider)
        arguments.validate_args(args, {})
        global_vars.set_global_variables(args, build_tokenizer=False)
        if job["mode"] == "zeppelin":
            from megatron_zeppelin.integration.megatron_lm import validate
            validate(args)
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
