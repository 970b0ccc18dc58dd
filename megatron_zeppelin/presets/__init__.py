"""Presets shipped as package data: hardware profiles (clusters/), models (models/), document-length
distributions (datasets/) and run matrices (runs/). Read through importlib.resources, so they are
found in a wheel install as in a source checkout.

>>> sorted(p[:-5] for p in os.listdir(preset_dir("clusters")) if p.endswith(".yaml"))[:2]
['a800', 'h100']
"""

from __future__ import annotations

import os  # noqa: F401 -- the doctest lists a folder
from importlib.resources import files

KINDS = ("clusters", "datasets", "models", "runs")


def preset_dir(kind: str) -> str:
    """The folder of one kind of preset (a path on disk: the package is never zipped)."""
    if kind not in KINDS:
        raise ValueError(f"unknown preset kind {kind!r} (one of {', '.join(KINDS)})")
    return str(files(__name__) / kind)
