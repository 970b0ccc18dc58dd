"""`zeppelin calibrate --device cpu` writes a profile that the planner accepts and that reproduces
the measured attention times through the cost model."""

import json

from megatron_zeppelin.cli import main
from megatron_zeppelin.model_spec import load_model
from megatron_zeppelin.planner.cost_model import CostModel
from megatron_zeppelin.profile import load_profile
from megatron_zeppelin.topology import Topology


def test_cpu_calibration_feeds_plan(tmp_path, capsys):
    out = tmp_path / "cpu.yaml"
    assert main(["calibrate", "--device", "cpu", "--lengths", "64", "256", "--repeats", "1",
                 "--out", str(out)]) == 0
    prof = load_profile(str(out))
    assert prof.attn_seqlen == (64, 256) and prof.gemm_tflops > 0 and prof.nvlink_GBps > 0
    assert prof.assumed == ("nic (= intra-node measurement)",)
    meas = json.loads((tmp_path / "cpu.measurements.json").read_text())
    # The cost model, fed the profile, predicts the measured forward time of each length.
    cm = CostModel(load_model("tiny"), prof, Topology(1, 2))
    for a in meas["attention"]:
        pred = cm.block_fwd_s(a["seqlen"], a["seqlen"], True)
        assert abs(pred - a["fwd_s"]) <= 1e-3 * a["fwd_s"]
    capsys.readouterr()
    assert main(["plan", "--dataset", "github", "--cluster", str(out), "--model", "tiny", "--nodes", "1",
                 "--gpus-per-node", "2", "--global-batch-tokens", "8K", "--context-length", "2K"]) == 0
    assert "lower bound" in capsys.readouterr().out.lower()
    capsys.readouterr()
    assert main(["simulate", "--dataset", "github", "--cluster", str(out), "--model", "tiny", "--nodes", "1",
                 "--global-batch-tokens", "8K", "--context-length", "2K", "--json", str(tmp_path / "sim.json")]) == 0
    sim = json.loads((tmp_path / "sim.json").read_text())
    assert sim and "iteration" in json.dumps(sim)
