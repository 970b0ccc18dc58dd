"""Load a script of benchmarks/ or validation_probes/ as a module (they are scripts, not a package),
for their tests."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(folder: str, name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, folder, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_bench(name: str):
    """``benchmarks/<name>.py`` (a benchmark of the product) as a fresh module."""
    return _load("benchmarks", name)


def load_probe(name: str):
    """``validation_probes/<name>.py`` (a probe of the CPU host the validation runs on) as a fresh module."""
    return _load("validation_probes", name)
