"""docs/cluster.md: the profile YAML of "Your own cluster", taken from the page, loads and plans; the
presets cite their sources in the YAML itself; an unknown cluster names the presets and the page."""

import os
import re

import pytest
import yaml

from megatron_zeppelin.cli import main
from megatron_zeppelin.spec.hardware import CLUSTERS_DIR, ProfileError, load_profile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(REPO, "docs", "cluster.md")
PRESETS = ("a800", "h100", "h200", "h800")


def _own_cluster_yaml() -> str:
    text = open(DOC).read()
    section = text.split("## Your own cluster", 1)[1]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def test_documented_profile_loads_and_plans(tmp_path, capsys):
    path = tmp_path / "my-cluster.yaml"
    path.write_text(_own_cluster_yaml())
    p = load_profile(str(path))
    assert (p.name, p.gpus_per_node, p.nics_per_node, p.nvlink_GBps, p.nic_GBps) == ("dgx-a100", 8, 8, 230.0, 24.0)
    assert main(["plan", "--cluster", str(path), "--model", "llama-7b", "--nodes", "2", "--dataset", "arxiv",
                 "--global-batch-tokens", "256K"]) == 0
    out = capsys.readouterr().out
    assert "cluster dgx-a100 (A100-80G SXM4)" in out and "8 NIC(s)/node" in out, out


@pytest.mark.parametrize("name", PRESETS)
def test_presets_cite_their_sources_in_the_yaml(name):
    text = open(os.path.join(CLUSTERS_DIR, f"{name}.yaml")).read()
    assert "shared/" not in text and "sec. " not in text  # no pointer to a file outside the project
    d = yaml.safe_load(text)
    comments = "\n".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)
    # every figure the cost model reads has a source (or is listed as assumed) beside it
    for field in ("gemm_tflops", "nvlink", "nic", "attention"):
        assert field in d
    assert re.search(r"arXiv \d{4}\.\d{4,5}", comments) and re.search(r"issue #\d+", comments), name
    assert "datasheet" in comments or name == "h800", name  # no public H800 datasheet: the DeepSeek-V3 report
    assert isinstance(d["assumed"], list)
    load_profile(name)


def test_h100_preset():
    p = load_profile("h100")
    assert (p.gpu, p.memory_GB, p.gpus_per_node, p.nics_per_node, p.nic_GBps) == ("H100 SXM5", 80.0, 8, 8, 47.0)
    assert p.nvlink_GBps <= 450  # achieved per direction: below NVLink 4's 450 GB/s line rate (900 total)


def test_unknown_cluster_names_the_presets_and_the_doc(capsys):
    with pytest.raises(ProfileError) as e:
        load_profile("h100x")
    msg = str(e.value)
    assert all(n in msg for n in PRESETS) and "did you mean h100?" in msg and "docs/cluster.md" in msg
    assert main(["plan", "--cluster", "h100x", "--model", "llama-7b", "--nodes", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--cluster" in err and "Your own cluster" in err
