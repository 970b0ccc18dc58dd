"""Predicted time of one inter-node ring step, direct vs routed, per cluster profile (writes JSON).

The paper's case (reference/paper.md 2.3): one 64K-token document on a ring of 16 ranks over 2 nodes
(TE CP), llama-7b; each ring step moves 4K tokens of K/V per member, two of them across nodes.
Two views: the single inter-node message alone (explain_step), and the whole step 0 of the ring
(all 16 messages, the 14 intra-node hops on NVLink) as predict.py times it.

    .venv/bin/python benchmarks/routing_step.py [--out benchmarks/results/routing_step.json]
"""

import argparse
import json
import os

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.planner.build.layout import zigzag_bounds
from megatron_zeppelin.planner.cost.predict import step_message_times
from megatron_zeppelin.planner.build.routing import explain_step, route_schedule
from megatron_zeppelin.planner.build.schedule import ring_ops
from megatron_zeppelin.planner.types import DocPlan, Ring
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.topology import Topology


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "routing_step.json"))
    ap.add_argument("--model", default="llama-7b")
    ap.add_argument("--length", type=int, default=65536)
    ap.add_argument("--nodes", type=int, default=2)
    args = ap.parse_args()
    model = load_model(args.model)
    rows = []
    for cluster in ("a800", "h800", "h200"):
        prof = load_profile(cluster)
        topo = Topology(args.nodes, prof.gpus_per_node, prof.nics_per_node, prof.gpu_to_nic)
        cost = CostModel(model, prof, topo)
        g = topo.world_size
        e = explain_step(cost, topo, (args.length // g) * cost.kv_bytes_per_token)
        docs = {0: DocPlan(0, args.length, "inter", 0, -1, zigzag_bounds(args.length, g))}
        ops = [o for o in ring_ops([Ring(0, tuple(range(g)), "inter", (0,))], docs, topo, cost.kv_bytes_per_token)
               if o.step == 0]
        routed = route_schedule(ops, topo, cost, ZeppelinConfig(routing="multi-nic"))
        step_direct = max(step_message_times(ops, cost).values())
        step_routed = max(step_message_times(routed, cost).values())
        compute = cost.ring_step_compute_s(args.length, g)
        rows.append({"cluster": cluster, "model": args.model, "length": args.length, "ring": g,
                     "message_bytes": e["nbytes"], "message_direct_s": e["direct_s"],
                     "message_routed_s": e["routed_s"], "message_stages_s": e["stages_s"],
                     "nics_used": e["nics_used"], "step_direct_s": step_direct, "step_routed_s": step_routed,
                     "step_compute_fwd_s": compute, "threshold_bytes": e["threshold_bytes"], "text": e["text"]})
        print(e["text"])
        print(f"  whole step 0 of the {g}-rank ring: direct {step_direct * 1e3:.3f} ms, routed "
              f"{step_routed * 1e3:.3f} ms; forward compute of the step {compute * 1e3:.3f} ms")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"paper": {"direct_ms": 2.18, "routed_ms": 0.411, "source": "reference/paper.md 2.3 [N]"},
                   "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
