"""CPU calibration and the simulator-vs-engine validation: real gloo ranks (structure only; timings
are measured, never asserted)."""

import pytest

from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.host import load_host
from megatron_zeppelin.validation.concurrent import SEQLENS, calibrate
from megatron_zeppelin.validation.validate import validate


@pytest.mark.slow  # ~100 s; test_bench_validate_cpu_command below calibrates and validates in the default run
def test_calibrate_and_validate_world_2(tmp_path):
    prof, host = cpu = calibrate(2, repeat=1)
    assert len(prof.attn_fwd_tflops) == len(SEQLENS) and min(prof.attn_fwd_tflops) > 0
    assert prof.nvlink_GBps > 0 and prof.gemm_tflops > 0 and prof.assumed
    assert 0 < host.cores <= 2 and host.post_us > 0
    path = tmp_path / "cpu.yaml"
    cpu.save(str(path))
    assert load_profile(str(path)) == prof  # `zeppelin plan/simulate --cluster FILE` accept it (the profile alone)
    assert load_host(str(path)) == host  # the validation's host: section
    vcpu, rows = validate(2, strategies=("zeppelin", "static_cp"), repeat=1, calib_repeat=1, tokens_per_rank=256)
    assert vcpu.profile.name == "cpu-w2" and vcpu.profile.attn_seqlen == SEQLENS and vcpu.host.cores > 0
    assert [r["strategy"] for r in rows] == ["zeppelin", "static_cp"]
    for r in rows:
        assert r["measured_s"] > 0 and r["predicted_s"] > 0 and r["tokens"] >= 512
        # the CPU the ranks took against the CPU the simulated pass charges (host cores > 0: compute is WORK)
        assert r["measured_cpu_s"] > 0 and r["simulated_cpu_s"] > 0
        # each repeat's host speed (reference rounds around it against the calibrations'), and the
        # error at the calibration's speed beside the raw one
        assert len(r["host_speed"]) == 1 and r["host_speed"][0] > 0
        assert r["measured_at_calibration_s"] == r["repeats"][0] * r["host_speed"][0]
        assert r["error_at_calibration"] == r["predicted_s"] / r["measured_at_calibration_s"] - 1.0
        # every calibration sample's own host_cores (before, mid-way, after), the profile's is their rounds' median
        cores = r["host_cores_per_sample"]
        assert len(cores) == 3 and all(0 < c <= 2 for c in cores)


def test_bench_validate_cpu_command(tmp_path, capsys):
    import json

    from megatron_zeppelin.cli import main
    out = tmp_path / "v.json"
    assert main(["bench", "--validate-cpu", "--world", "1", "--repeat", "1", "--json", str(out),
                 "--profiles", str(tmp_path)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == 6 and doc["command"].startswith("zeppelin bench --validate-cpu")
    assert [p["name"] for p in doc["profiles"]] == ["cpu-w1"]  # each world's calibrated profile, kept with its rows
    assert doc["profiles"][0]["host"]["cores"] > 0  # and its host
    assert (tmp_path / "cpu-w1.yaml").exists()
    printed = capsys.readouterr().out
    assert "mean |error|" in printed and "at the calibration's host speed" in printed
