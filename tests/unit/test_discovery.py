"""Topology discovery from fabricated SLURM / torchrun environments and nvidia-smi topology text."""

import pytest

from megatron_zeppelin.spec.discovery import discover_topology, parse_nvidia_smi_topo
from megatron_zeppelin.spec.topology import TopologyError

# 8 GPUs, 4 compute NICs shared by GPU pairs (cluster A's wiring), plus a storage NIC nobody is close to.
TOPO_A = """
        GPU0 GPU1 GPU2 GPU3 GPU4 GPU5 GPU6 GPU7 mlx5_0 mlx5_1 mlx5_2 mlx5_3 mlx5_4 CPU Affinity
GPU0     X   NV8  NV8  NV8  NV8  NV8  NV8  NV8  PXB    SYS    SYS    SYS    SYS    0-47
GPU1    NV8   X   NV8  NV8  NV8  NV8  NV8  NV8  PXB    SYS    SYS    SYS    SYS    0-47
GPU2    NV8  NV8   X   NV8  NV8  NV8  NV8  NV8  SYS    PXB    SYS    SYS    SYS    0-47
GPU3    NV8  NV8  NV8   X   NV8  NV8  NV8  NV8  SYS    PXB    SYS    SYS    SYS    0-47
GPU4    NV8  NV8  NV8  NV8   X   NV8  NV8  NV8  SYS    SYS    PXB    SYS    NODE   48-95
GPU5    NV8  NV8  NV8  NV8  NV8   X   NV8  NV8  SYS    SYS    PXB    SYS    NODE   48-95
GPU6    NV8  NV8  NV8  NV8  NV8  NV8   X   NV8  SYS    SYS    SYS    PXB    NODE   48-95
GPU7    NV8  NV8  NV8  NV8  NV8  NV8  NV8   X   SYS    SYS    SYS    PXB    NODE   48-95
"""


def test_parse_shared_nics_and_drop_storage_nic():
    m = parse_nvidia_smi_topo(TOPO_A)
    assert m.gpus == 8 and m.nic_names == ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
    assert m.gpu_to_nic == (0, 0, 1, 1, 2, 2, 3, 3)


def test_slurm_env_and_system_map():
    env = {"SLURM_NNODES": "4", "SLURM_NTASKS_PER_NODE": "8"}
    t = discover_topology(env, topo_text=TOPO_A)
    assert (t.nodes, t.gpus_per_node, t.nics_per_node, t.gpu_to_nic) == (4, 8, 4, (0, 0, 1, 1, 2, 2, 3, 3))


def test_torchrun_env_without_system_uses_flags():
    env = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}
    t = discover_topology(env, nics_per_node=8, probe=False)
    assert (t.nodes, t.gpus_per_node, t.nics_per_node) == (2, 8, 8) and t.gpu_to_nic == tuple(range(8))


def test_slurm_tasks_count_form():
    t = discover_topology({"SLURM_NNODES": "2", "SLURM_NTASKS": "16"}, probe=False)
    assert (t.nodes, t.gpus_per_node) == (2, 8)
    t = discover_topology({"SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "8(x2)"}, probe=False)
    assert t.gpus_per_node == 8


@pytest.mark.parametrize("kw, flag", [
    (dict(nics_per_node=8), "--zeppelin-nics-per-node"),
    (dict(gpu_nic_map=(0, 1, 2, 3, 4, 5, 6, 7)), "--zeppelin-gpu-nic-map"),
    (dict(gpus_per_node=4), "--zeppelin-gpus-per-node"),
    (dict(nodes=2), "--nodes"),
])
def test_contradictions_name_the_flag(kw, flag):
    env = {"SLURM_NNODES": "4", "SLURM_NTASKS_PER_NODE": "8"}
    with pytest.raises(TopologyError, match=flag):
        discover_topology(env, topo_text=TOPO_A, **kw)


def test_gpu_count_mismatch_and_unreadable_text():
    with pytest.raises(TopologyError, match="ntasks-per-node"):
        discover_topology({"SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "4"}, topo_text=TOPO_A)
    with pytest.raises(TopologyError, match="gpu-nic-map"):
        parse_nvidia_smi_topo("garbage")
    with pytest.raises(TopologyError, match="divide"):
        discover_topology({"WORLD_SIZE": "12", "LOCAL_WORLD_SIZE": "8"}, probe=False)


def test_nccl_ib_hca_filter():
    m = parse_nvidia_smi_topo(TOPO_A, hca_filter=["mlx5_0", "mlx5_1"])
    assert m.nic_names == ("mlx5_0", "mlx5_1") and m.gpu_to_nic[:4] == (0, 0, 1, 1)
