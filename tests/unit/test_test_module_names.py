"""pytest imports test modules by basename (no __init__.py under tests/), so two test files of the same
name in different folders stop the whole run at collection ("import file mismatch")."""

import collections
import os

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_test_module_name_is_unique():
    seen = collections.defaultdict(list)
    for root, _, files in os.walk(HERE):
        for f in files:
            if f.startswith("test_") and f.endswith(".py"):
                seen[f].append(os.path.relpath(os.path.join(root, f), HERE))
    assert not {k: v for k, v in seen.items() if len(v) > 1}
