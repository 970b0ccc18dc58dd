"""docs/results.md's headline (Zeppelin against the best deployed baseline per configuration) from
the given study files only, e.g. the accumulation studies rerun on a branch:

    PYTHONPATH=. .venv/bin/python scripts/accumulation_headline.py results/aligned/bench/accumulation*.json
"""

import json
import sys

from megatron_zeppelin.reports.headline import headline, render


def main(paths) -> int:
    runs = []
    for path in paths:
        with open(path) as f:
            runs += json.load(f)["runs"]
    print("\n".join(render(headline(runs))[:16]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
