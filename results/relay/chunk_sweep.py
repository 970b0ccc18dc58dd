"""Predicted time of one inter-node ring message of llama-7b's 64K document (4096 tokens x 16 KiB, rank 7 ->
rank 8 of a 16-rank ring over 2 nodes) by relay chunk size, per GPU preset (planner/build/routing.py
explain_step). Run: PYTHONPATH=. .venv/bin/python results/relay/chunk_sweep.py  (writes chunk_sweep.json here)."""
import json
import os

from megatron_zeppelin.planner.build.routing import explain_step
from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.topology import Topology

m = load_model("llama-7b")
out = {}
for c in ("a800", "h800", "h200"):
    p = load_profile(c)
    topo = Topology(2, p.gpus_per_node, p.nics_per_node, p.gpu_to_nic)
    for ch in (0, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20):
        e = explain_step(CostModel(m, p, topo), topo, 4096 * m.kv_bytes_per_token(), ZeppelinConfig(relay_chunk_bytes=ch))
        out.setdefault(c, []).append({k: e[k] for k in ("chunk_bytes", "chunks", "direct_s", "unpipelined_s", "routed_s",
                                                         "stages_s", "pieces")})
        print(c, ch, f"direct {e['direct_s'] * 1e3:.3f} ms, unpipelined {e['unpipelined_s'] * 1e3:.3f} ms, "
                     f"pipelined {e['routed_s'] * 1e3:.3f} ms ({e['chunks']} chunks a piece)")
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "chunk_sweep.json"), "w") as f:
    json.dump(out, f, indent=1)
