"""The Llama 3 presets (GQA: 8 KV heads) beside the MHA ones: their shapes, and the cost model and
the Plan reading the KV heads (a ring step moves 1/4 of the K/V of an MHA model of the same size)."""

from dataclasses import replace

import pytest

from megatron_zeppelin.planner import plan_batch
from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.topology import Topology


@pytest.mark.parametrize("name,shape", [
    ("llama3-8b", (32, 4096, 32, 8, 14336, 128256)),
    ("llama3-70b", (80, 8192, 64, 8, 28672, 128256)),
])
def test_llama3_shapes(name, shape):
    m = load_model(name)
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab) == shape
    assert m.head_dim == 128 and not m.is_moe


def _ring_step_bytes(model, tp=1):
    """Bytes of every ring-step op of one static_cp plan (CP 2: inside one a800 node, or over two
    nodes at TP 8, one domain rank per node)."""
    profile = load_profile("a800")
    topo = Topology(1 if tp == 1 else 2, 8 // tp, max(1, profile.nics_per_node // tp))
    cfg = ZeppelinConfig(gpus_per_node=8 // tp, tp=tp, cp_size=2, cp_comm="p2p")  # TE's ring: K/V messages
    plan = plan_batch([8192, 6000, 4000, 2000], topo, profile, model, cfg, strategy="static_cp")
    assert plan.rings and plan.kv_bytes_per_token == model.kv_bytes_per_token(tp)
    return [o.nbytes for o in plan.schedule], plan


def test_a_ring_step_moves_a_quarter_of_the_mha_kv():
    gqa = load_model("llama3-8b")
    mha = replace(gqa, name="llama3-8b-mha", kv_heads=gqa.heads)  # the same model with one KV head per head
    assert gqa.kv_bytes_per_token() * 4 == mha.kv_bytes_per_token() == 2 * 4096 * 2
    g, gp = _ring_step_bytes(gqa)
    m, mp = _ring_step_bytes(mha)
    assert len(g) == len(m) and all(4 * a == b for a, b in zip(g, m))
    assert [r.ranks for r in gp.rings] == [r.ranks for r in mp.rings]  # the same rings: only bytes differ
    profile, topo = load_profile("a800"), Topology(1, 8, 4)
    cg, cm = CostModel(gqa, profile, topo), CostModel(mha, profile, topo)
    tg = float(cg.ring_step_transfer_s(8192, 2, "nvlink"))
    tm = float(cm.ring_step_transfer_s(8192, 2, "nvlink"))
    assert tg < tm  # the prediction prices the smaller messages (latency aside: 1/4 of the bytes)


def test_llama3_70b_under_tp8_keeps_one_kv_head_per_rank():
    gqa = load_model("llama3-70b")
    mha = replace(gqa, name="llama3-70b-mha", kv_heads=gqa.heads)
    assert gqa.kv_bytes_per_token(tp=8) == 2 * 1 * 128 * 2  # 8 KV heads over TP 8
    assert mha.kv_bytes_per_token(tp=8) == 8 * gqa.kv_bytes_per_token(tp=8)
    g, _ = _ring_step_bytes(gqa, tp=8)
    m, _ = _ring_step_bytes(mha, tp=8)
    assert all(8 * a == b for a, b in zip(g, m))
