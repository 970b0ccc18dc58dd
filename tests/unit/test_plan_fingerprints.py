"""The planner's speed-ups change no plan: every strategy's Plan on a set of seeded batches (toy and
a800 / llama-7b contexts, tight capacities, small batches, one long document over two nodes) has
the fingerprint stored in plan_fingerprints.json, written by the planner before its latency work.

A fingerprint is the plan's structure exactly (documents, rings, both layouts, remap moves, routed
schedule, the chosen variant) and its predicted per-rank costs to 9 significant digits (vectorised
sums may differ in the last bits). A change of the planner's choices must regenerate the file and
say why:

    .venv/bin/python tests/unit/test_plan_fingerprints.py --write
"""

import hashlib
import json
import os
import sys
import time

import numpy as np
import pytest

from megatron_zeppelin.spec.config import STRATEGIES, ZeppelinConfig
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner import plan_batch
from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.topology import Topology

HERE = os.path.dirname(os.path.abspath(__file__))
STORE = os.path.join(HERE, "plan_fingerprints.json")


def _meta(plan) -> dict:
    try:
        return {str(k): str(v) for k, v in dict(plan.meta).items()}
    except (TypeError, ValueError):  # typed metadata: its fields
        return {k: str(v) for k, v in vars(plan.meta).items()}


def fingerprint(plan) -> str:
    seg = lambda s: (s.doc, s.start, s.stop)  # noqa: E731
    doc = {
        "docs": [(d.doc, d.length, str(d.cls), d.ring, d.owner, list(d.bounds)) for d in plan.docs],
        "rings": [(r.id, list(r.ranks), str(r.cls), list(r.docs), str(r.comm)) for r in plan.rings],
        "att": [[seg(s) for s in r] for r in plan.attention_layout],
        "lin": [[seg(s) for s in r] for r in plan.linear_layout],
        "remap": [(m.src, m.dst, [seg(s) for s in m.segments]) for m in plan.remap],
        "ops": [(str(o.queue), o.step, o.ring, o.block, o.msg_src, o.msg_dst, o.src, o.dst, o.start, o.stop,
                 o.nbytes, str(o.link), o.nic, str(o.stage)) for o in plan.schedule],
        "cost": [[f"{x:.9g}" for x in (c.attention_s, c.linear_s, c.comm_exposed_s, c.remap_s)] for c in plan.cost],
        "variant": _meta(plan).get("variant", ""),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def _lognormal(n, seed, cap=65536):
    return np.random.default_rng(seed).lognormal(7.5, 1.3, n).clip(1, cap).astype(np.int64).tolist()


def cases():
    """(name, lengths, topology, profile, model, config, strategies)."""
    from megatron_zeppelin.data.workloads import sample_batch
    a800, m7 = load_profile("a800"), load_model("llama-7b")
    out = []
    for seed in range(3):  # toy: small domains, every strategy
        rng = np.random.default_rng(seed)
        lengths = rng.integers(1, 9000, 12).tolist() + [int(rng.integers(9000, 40000))]
        for nodes, gpus in ((1, 4), (2, 2), (2, 4)):
            out.append((f"toy{seed}-{nodes}x{gpus}", lengths, Topology(nodes, gpus), TOY_PROFILE, TOY_MODEL,
                        ZeppelinConfig(gpus_per_node=gpus), STRATEGIES))
    t2 = Topology(2, 8, a800.nics_per_node, a800.gpu_to_nic)
    t4 = Topology(4, 8, a800.nics_per_node, a800.gpu_to_nic)
    cfg = ZeppelinConfig(gpus_per_node=8)
    for ds in ("arxiv", "github", "prolong64k"):
        out.append((f"{ds}-2x8", sample_batch(ds, 1 << 18, seed=0, max_len=65536).tolist(), t2, a800, m7, cfg,
                    STRATEGIES))
    out.append(("prolong64k-4x8", sample_batch("prolong64k", 1 << 20, seed=1, max_len=65536).tolist(), t4, a800,
                m7, cfg, ("zeppelin", "static_cp", "packed_dp")))
    out.append(("one64k-2x8", [65536], t2, a800, m7, cfg, STRATEGIES))
    out.append(("small-1x4", [9000, 3000], Topology(1, 4, 4), a800, m7,
                ZeppelinConfig(gpus_per_node=4), STRATEGIES))
    out.append(("lognormal300-2x8", _lognormal(300, 0), t2, a800, m7, cfg, ("zeppelin", "packed_dp", "hybrid_dp")))
    tight = _lognormal(200, 1)
    out.append(("tight-2x8", tight, t2, a800, m7,
                ZeppelinConfig(gpus_per_node=8, capacity_tokens=int(1.1 * sum(tight) / 16)), ("zeppelin",)))
    out.append(("noremap-2x8", _lognormal(200, 2), t2, a800, m7, ZeppelinConfig(gpus_per_node=8, remap=False),
                ("zeppelin",)))
    return out


def compute(verbose=False) -> dict:
    got = {}
    for name, lengths, topo, prof, model, cfg, strategies in cases():
        for s in strategies:
            t0 = time.process_time()
            got[f"{name}/{s}"] = fingerprint(plan_batch(lengths, topo, prof, model, cfg, strategy=s))
            if verbose:
                print(f"{name}/{s}: {time.process_time() - t0:.2f} s CPU")
    return got


def test_plans_unchanged():
    with open(STORE) as f:
        want = json.load(f)
    got = compute()
    assert set(got) == set(want)
    changed = sorted(k for k in want if got[k] != want[k])
    assert not changed, f"plans changed: {changed}"


if __name__ == "__main__":
    if "--write" in sys.argv:
        with open(STORE, "w") as f:
            json.dump(compute(verbose=True), f, indent=1, sort_keys=True)
        print(f"wrote {STORE}")
    else:
        pytest.main([__file__, "-q"])
