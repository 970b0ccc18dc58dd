"""`zeppelin calibrate --device cpu` writes a profile that the planner accepts and that reproduces
the measured attention times through the cost model."""

import json

import pytest

from megatron_zeppelin.cli import main
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.topology import Topology


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


def test_noise_is_measured_again_then_named():
    import pytest
    from megatron_zeppelin.calibrate.noise import settle, suspects

    def rec(L, fwd, bwd=1e-3, spread=1.1):
        return {"seqlen": L, "fwd_s": 1.0 / fwd, "bwd_s": 1.0 / bwd, "fwd_tflops": fwd, "bwd_tflops": bwd,
                "fwd_spread": spread, "bwd_spread": 1.0}
    calm = [rec(128, 1e-3), rec(256, 1.5e-3), rec(512, 2e-3)]
    assert suspects(calm) == {}
    # a busy moment: L=256 ran 400x slow, and its repeats disagreed
    busy = [rec(128, 1e-3), rec(256, 2.5e-6, spread=5.0), rec(512, 2e-3)]
    assert set(suspects(busy)) == {256}
    calls, logs = [], []

    def again(ls):  # the second round is calm
        calls.append(ls)
        return [rec(L, {128: 1e-3, 256: 1.5e-3, 512: 2e-3}[L]) for L in ls]
    att, warnings = settle(busy, again, retries=2, log=logs.append)
    assert calls == [[256]] and warnings == [] and "L=256" in logs[0] and "repeats varied 5.0x" in logs[0]
    assert att[1]["fwd_tflops"] == pytest.approx(1.5e-3)
    # still busy after every round: a warning naming the length and what was noisy
    att, warnings = settle(busy, lambda ls: [rec(L, 2e-6, spread=3.0) for L in ls], retries=2, log=logs.append)
    assert len(warnings) == 1 and warnings[0].startswith("attention L=256: forward repeats varied")
    assert "below half of L=128" in warnings[0] and "span" in warnings[0]
    # a non-monotonic rate alone (repeats agreeing) is caught too
    assert "below half of L=128" in suspects([rec(128, 1e-3), rec(256, 1e-3), rec(512, 4e-4)])[512]


def test_calibrate_flags_checked_before_measuring(tmp_path, capsys):
    for argv, needle in ((["--repeats", "0"], "--repeats must be >= 1"), (["--tp", "3"], "--tp 3 does not divide"),
                         (["--lengths", "0"], "--lengths must be positive"), (["--base", "z900"], "set --base"),
                         (["--out", "/proc/nope/x.yaml"], "cannot write --out")):
        assert main(["calibrate", "--device", "cpu", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err


def test_split_cost_recovered_from_own_block_probes():
    """The calibration's split cost is what the own-block probes (ring step 0) took beyond the
    model's own price of the same blocks: probes made of that price plus a known split cost
    give that cost back into the host (spec/host.py), and without the probes the host is left as it is."""
    from dataclasses import replace

    from megatron_zeppelin.spec.host import HostModel

    from megatron_zeppelin.validation.concurrent import SPLIT_LENS, _probe_docs, probe_price, spread_lengths, with_splits
    from megatron_zeppelin.planner.testing import TOY_PROFILE
    p = replace(TOY_PROFILE, attn_call_fwd_us=40.0, attn_call_bwd_us=90.0, attn_seq_fwd_us=8.0, attn_seq_bwd_us=15.0)
    rank = {"own_fwd": {}, "own_bwd": {}}
    for L in SPLIT_LENS:
        chunks = spread_lengths(L, _probe_docs(L))
        fwd, bwd = probe_price(p, chunks, 0, 0)
        rank["own_fwd"][L] = fwd + len(chunks) * 30e-6 + sum(chunks) * 0.5e-6
        rank["own_bwd"][L] = bwd + sum(chunks) * 2e-6
    host = HostModel(cores=2.0, post_us=300.0)
    got = with_splits([[rank, rank]], p, host)
    assert got.split_fwd_us == pytest.approx(30.0, abs=1e-6)
    assert got.split_row_fwd_us == pytest.approx(0.5, abs=1e-9)
    assert got.split_bwd_us == pytest.approx(0.0, abs=1e-6)
    assert got.split_row_bwd_us == pytest.approx(2.0, abs=1e-9)
    assert (got.cores, got.post_us) == (2.0, 300.0)  # the rest of the host kept
    assert with_splits([[{"own_fwd": {}}, {}]], p, host) == host
