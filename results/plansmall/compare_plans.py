"""Plans of this tree against another's (PYTHONPATH picks the tree): for each case, a hash of the
Plan's JSON without its meta, and the meta's pairs. Run once per tree, then compare the two files:

    PYTHONPATH=. .venv/bin/python results/plansmall/compare_plans.py results/plansmall/plans_new.json
    PYTHONPATH=results/src/main .venv/bin/python results/plansmall/compare_plans.py results/plansmall/plans_main.json
    .venv/bin/python results/plansmall/compare_plans.py --diff results/plansmall/plans_main.json results/plansmall/plans_new.json
"""
import dataclasses
import hashlib
import json
import sys

import numpy as np


def cases():
    from megatron_zeppelin.data.workloads import sample_batch
    from megatron_zeppelin.spec.config import ZeppelinConfig
    from megatron_zeppelin.spec.hardware import load_profile
    from megatron_zeppelin.spec.model import load_model
    from megatron_zeppelin.spec.topology import Topology
    m7, m13 = load_model("llama-7b"), load_model("llama-13b")
    for cl in ("a800", "h200", "h800"):
        prof = load_profile(cl)
        for n, nodes in ((100, 8), (300, 4), (1000, 8)):
            for seed in (0, 1):
                L = np.random.default_rng(seed).lognormal(7.5, 1.3, n).clip(1, 65536).astype(np.int64)
                yield (f"{cl}-lognormal{n}-{nodes}x8-s{seed}", L, Topology(nodes, 8, prof.nics_per_node, prof.gpu_to_nic),
                       prof, m7, ZeppelinConfig(gpus_per_node=8))
        for ds in ("arxiv", "github", "prolong64k"):
            L = np.asarray(sample_batch(ds, 1 << 19, seed=0, max_len=65536))
            yield (f"{cl}-{ds}-4x8-tp2", L, Topology(4, 8, prof.nics_per_node, prof.gpu_to_nic), prof, m13,
                   ZeppelinConfig(gpus_per_node=8, tp=2))


def main():
    if sys.argv[1] == "--diff":
        a, b = (json.load(open(p)) for p in sys.argv[2:4])
        same = [k for k in a if a[k]["plan"] == b.get(k, {}).get("plan")]
        print(f"{len(same)} of {len(a)} plans equal (meta aside)")
        for k in a:
            if a[k]["plan"] != b[k]["plan"]:
                print("PLAN DIFFERS", k, a[k]["meta"].get("variant"), b[k]["meta"].get("variant"))
            for f in sorted(set(a[k]["meta"]) | set(b[k]["meta"])):
                x, y = a[k]["meta"].get(f), b[k]["meta"].get(f)
                if x != y:
                    print(f"  {k} meta {f}: {'same names, other order' if x and y and sorted(x.split(', ')) == sorted(y.split(', ')) else (x, y)}")
        return
    from megatron_zeppelin.planner import Planner
    from megatron_zeppelin.planner.meta import PlanMeta
    out = {}
    for name, L, topo, prof, model, cfg in cases():
        try:
            plan = Planner(topo, prof, model, cfg).plan(L)
        except Exception as e:  # noqa: BLE001 (a case a tree refuses: named, compared as such)
            out[name] = {"plan": f"error: {e}", "meta": {}}
            continue
        bare = dataclasses.replace(plan, meta=PlanMeta())
        out[name] = {"plan": hashlib.sha256(bare.to_json().encode()).hexdigest()[:16], "meta": dict(plan.meta)}
        print(name, out[name]["plan"], flush=True)
    json.dump(out, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
