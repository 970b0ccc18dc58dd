"""The ``zeppelin`` command. Each sub-command lives in megatron_zeppelin/commands/<name>.py with
``add_parser(subparsers)`` (help text, flags) and ``run(args) -> int``; user errors (bad flags, files,
inputs) print one clear line and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> module under megatron_zeppelin.commands (order = order in --help)
COMMANDS = ("plan", "simulate", "bench", "demo", "train", "calibrate", "report", "slurm", "compare_dp", "advise")


def _load(name):
    try:
        return importlib.import_module(f"megatron_zeppelin.commands.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"megatron_zeppelin.commands.{name}":
            return None
        raise


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zeppelin", description="Zeppelin for Megatron-Core: plan, simulate, benchmark and train "
                                "variable-length data-parallel batches.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        mod = _load(name)
        if mod is not None:
            mod.add_parser(sub)
    return p


from megatron_zeppelin.errors import ZeppelinError

USER_ERRORS = (ZeppelinError, FileNotFoundError)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as e:
        if getattr(args, "debug", False):
            raise
        print(f"zeppelin {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
