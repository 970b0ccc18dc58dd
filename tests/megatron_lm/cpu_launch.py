"""``cpu_launch.py SCRIPT ARGS...``: run a Megatron-LM script (the patched pretrain_gpt.py) on CPU:
install the CPU shim, then run SCRIPT as ``__main__`` with its own folder first on sys.path."""

import os
import runpy
import sys


def main():
    from megatron_zeppelin.integration import cpu_megatron_lm

    cpu_megatron_lm.install()
    script = os.path.abspath(sys.argv[1])
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
