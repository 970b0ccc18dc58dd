"""A stored study file's runs read back as the RunSpecs that made them, to rerun one configuration.

A study file (``results/bench/<study>.json``, ``zeppelin bench``) keeps each run's record: its
RunSpec's fields beside what was measured. Benchmarks that replan one configuration (a budget, a
batching, a profile) take the spec from there rather than rebuilding it from the matrix.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Dict, List, Tuple

from megatron_zeppelin.sim import runs
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


def recorded_setup(spec: RunSpec, record: Dict):
    """(profile, model, topology, ZeppelinConfig) of one stored run as it was deployed: the domain of
    one pipeline stage, the record's recompute and that rung's capacity (the run's own capacity where
    the rung has none)."""
    from megatron_zeppelin.spec.config import ZeppelinConfig
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.spec.model import load_model
    profile, model = load_profile(spec.cluster), load_model(spec.model)
    topo = runs.domain_topology(profile, spec.domain_nodes, spec.tp)
    capacity = dict(runs.recompute_rungs(spec)).get(record["recompute"], spec.capacity)
    config = ZeppelinConfig(gpus_per_node=topo.gpus_per_node, nics_per_node=topo.nics_per_node,
                            gpu_nic_map=topo.gpu_to_nic, cluster=spec.cluster, tp=spec.tp,
                            capacity_tokens=capacity, recompute=record["recompute"])
    return profile, model, topo, config
