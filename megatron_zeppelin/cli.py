"""The ``zeppelin`` command. Each sub-command lives in megatron_zeppelin/commands/<name>.py with
``add_parser(subparsers)`` (help text, flags) and ``run(args) -> int``; user errors (bad flags, files,
inputs) print one clear line naming the sub-command and exit 2, never a traceback or a usage page
(``zeppelin plan --global-batch-tokens -1M``: "zeppelin plan: error: argument --global-batch-tokens:
'-1M' is not a whole, non-negative token count (zeppelin plan --help lists the flags)")."""

from __future__ import annotations

import argparse
import importlib
import re
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


class Parser(argparse.ArgumentParser):
    """argparse with the two habits the README promises: a usage error is one line on stderr (the
    sub-command's name, the flag, a pointer to --help; exit 2), and a value that starts with a minus
    sign and a digit (``-1``, ``-1M``, ``-0.5``) is read as the flag's value, so the flag's own check
    refuses it, rather than as an unknown option ("expected one argument")."""

    # argparse's own matcher knows only plain numbers; token counts carry a K/M/G suffix.
    NEGATIVE = re.compile(r"^-(\d+\.?\d*|\.\d+)(e-?\d+)?[kmgKMG]?$")

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._negative_number_matcher = self.NEGATIVE

    def error(self, message):
        print(f"{self.prog}: error: {message} ({self.prog} --help lists the flags)", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="zeppelin", description="Zeppelin for Megatron-Core: plan, simulate, benchmark and train "
               "variable-length data-parallel batches.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMANDS:
        mod = _load(name)
        if mod is not None:
            mod.add_parser(sub)
    return p


def _parse(parser: argparse.ArgumentParser, argv):
    """``parse_args``, except that a flag the sub-command does not know is reported by the sub-command's
    parser (``zeppelin advise: error: unrecognized arguments``), not by ``zeppelin``'s."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        command = getattr(args, "command", None)
        owner = subs[0].choices.get(command, parser) if subs and command else parser
        owner.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


from megatron_zeppelin.errors import ZeppelinError

USER_ERRORS = (ZeppelinError, FileNotFoundError)


def main(argv=None) -> int:
    parser = build_parser()
    args = _parse(parser, argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        rc = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return rc
    except USER_ERRORS as e:
        if getattr(args, "debug", False):
            raise
        print(f"zeppelin {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (``zeppelin plan ... | head -1``): stop quietly, with
        _quiet_stdout()      # the status rich's console gives the same case (and Python's recipe)
        return 1


def _quiet_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush cannot raise
    again (the recipe of Python's signal documentation)."""
    import os
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (a test's capture): nothing to flush
        pass


if __name__ == "__main__":
    sys.exit(main())
