"""A stored study file's runs read back as the RunSpecs that made them, to rerun one configuration.

A study file (``results/bench/<study>.json``, ``zeppelin bench``) keeps each run's record: its
RunSpec's fields beside what was measured. Benchmarks that replan one configuration (a budget, a
batching, a profile) take the spec from there rather than rebuilding it from the matrix.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Dict, List, Tuple

from megatron_zeppelin.sim.runs import RunSpec


def spec_of(record: Dict) -> RunSpec:
    """The RunSpec of one stored record (its other keys, the measurements, dropped)."""
    fields = {f.name for f in dataclasses.fields(RunSpec)}
    return RunSpec(**{k: v for k, v in record.items() if k in fields})


def stored_runs(path: str, variant: str = "zeppelin", **match) -> List[Tuple[RunSpec, Dict]]:
    """Each record of study file ``path`` of ``variant`` whose keys equal ``match`` (``label=...``,
    ``dataset=...``), as its RunSpec and the record; raises SystemExit naming the file if none."""
    with open(path) as f:
        stored = json.load(f)["runs"]
    out = [(spec_of(r), r) for r in stored
           if r["variant"] == variant and all(r.get(k) == v for k, v in match.items())]
    if not out:
        what = ", ".join(f"{k}={v!r}" for k, v in match.items())
        raise SystemExit(f"no {variant} run with {what or 'any settings'} in {path}")
    return out
