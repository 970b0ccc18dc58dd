"""The MoE terms of the cost model (planner/cost/moe_cost.py): top-k expert FLOPs, the dispatch/combine
all-to-alls, the sampled expert load; the prediction and the simulator price an MoE layer the same."""

from dataclasses import replace

import numpy as np
import pytest

from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner import plan_batch
from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.planner.cost.moe_cost import expert_loads, moe_pass_s, rank_expert_loads
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.topology import Topology

pytestmark = pytest.mark.moe


def _cost(model="moe-8x550m", nodes=2, gpn=4, **over):
    m = load_model(model)
    return CostModel(replace(m, **over) if over else m, load_profile("h200"), Topology(nodes, gpn))


def test_models_load():
    m = load_model("moe-8x550m")
    assert (m.experts, m.top_k, m.expert_ffn) == (8, 2, m.ffn)
    assert 540e6 < replace(m, experts=0, top_k=0, expert_ffn=0).params() < 560e6  # one dense copy: 550M
    t = load_model("tiny-moe")
    assert t.experts == 4 and t.top_k == 2


def test_sampled_loads_are_deterministic_and_skewed_by_the_knob():
    a, b = expert_loads(8, 2, 4096, skew=1.0), expert_loads(8, 2, 4096, skew=1.0)
    assert a.tolist() == b.tolist() and a.sum() == 2 * 4096
    flat, skewed = expert_loads(8, 2, 4096, skew=0.0), a
    assert skewed.max() / skewed.mean() > flat.max() / flat.mean()
    assert rank_expert_loads(a, 8).tolist() == a.tolist() and rank_expert_loads(a, 1).tolist() == [a.sum()]


def test_uniform_router_costs_top_k_experts_plus_the_all_to_alls():
    c = _cost(router_skew=0.0)
    t = np.full(8, 4096.0)
    f = moe_pass_s(c, t)
    dense_k = float(c.gemm_s(4096, "mlp"))  # top_k experts + router per token: the FLOP-based view
    assert np.allclose(f, f[0])  # equal tokens: the group waits for one busiest rank
    assert f[0] > dense_k  # sampling noise and the all-to-alls only add
    # the all-to-alls are the same in both passes, the GEMMs double
    b = moe_pass_s(c, t, backward=True)
    assert b[0] < 2 * f[0] and b[0] > f[0]


def test_skew_slows_the_expert_part():
    t = np.full(8, 4096.0)
    assert moe_pass_s(_cost(router_skew=1.5), t)[0] > moe_pass_s(_cost(router_skew=0.0), t)[0]


def test_dense_model_is_unchanged():
    c = _cost("llama-3b")
    t = np.array([100.0, 200.0] * 4)
    assert np.allclose(moe_pass_s(c, t), c.gemm_s(t, "mlp"))
    assert np.allclose(moe_pass_s(c, t, backward=True), 2 * c.gemm_s(t, "mlp"))


def test_prediction_and_simulator_charge_the_same_moe_layer():
    """Both read moe_pass_s: the simulator's per-rank linear compute equals the prediction's."""
    from megatron_zeppelin.sim.iteration import SimOptions, simulate

    m = load_model("moe-8x550m")
    prof = load_profile("h200")
    lengths = [32768, 9000, 4000, 2500, 1200, 800, 600, 300] * 2
    plan = plan_batch(lengths, Topology(2, 4), prof, m, ZeppelinConfig(gpus_per_node=4))
    sim = simulate(plan, prof, m, options=SimOptions(allreduce=False))
    for r, rc in enumerate(plan.cost):
        assert sim.rank_compute_s[r]["linear"] + sim.rank_compute_s[r].get("head", 0.0) == pytest.approx(rc.linear_s, rel=1e-6)
    # the dispatch/combine and the EP group's busiest expert make the MoE layer slower than its FLOPs
    t = np.array([plan.tokens(r, "linear") for r in range(8)], dtype=float)
    cost = CostModel(m, prof, Topology(2, 4))
    assert (moe_pass_s(cost, t) > cost.gemm_s(t, "mlp")).all()
