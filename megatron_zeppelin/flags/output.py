"""Output files a command writes at its end (``--json``, ``--plot``, ``--gantt``), checked at its start:
a path that cannot be written is one line naming the flag before anything is sampled, tokenized or
planned, not after minutes of work. Nothing is created here (a failed run leaves no empty file).

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> check_output_paths([("--json", os.path.join(d, "plan.json")), ("--plot", None)])
>>> check_output_paths([("--plot", os.path.join(d, "missing", "plan.png"))])  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
megatron_zeppelin.flags.domain.FlagError: cannot write --plot .../missing/plan.png: no directory .../missing (create it, or set --plot to a path in an existing one)
>>> check_output_paths([("--json", d)])  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
megatron_zeppelin.flags.domain.FlagError: cannot write --json ...: it is a directory (set --json to a file path)
"""

from __future__ import annotations

import os
from typing import Iterable, Optional, Tuple

from megatron_zeppelin.flags.domain import FlagError


def check_output_paths(paths: Iterable[Tuple[str, Optional[str]]]) -> None:
    """Each (flag, path or None): the path names a file that can be created or overwritten."""
    for flag, path in paths:
        if not path:
            continue
        if os.path.isdir(path):
            raise FlagError(f"cannot write {flag} {path}: it is a directory (set {flag} to a file path)")
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise FlagError(f"cannot write {flag} {path}: no directory {parent} (create it, or set {flag} to a path "
                            "in an existing one)")
        target = path if os.path.exists(path) else parent
        if not os.access(target, os.W_OK):
            raise FlagError(f"cannot write {flag} {path}: {target} is not writable (set {flag} to a writable path)")
