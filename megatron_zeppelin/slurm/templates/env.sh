# Shared environment of every Zeppelin / stock-Megatron job script (sourced by the rendered sbatch files).
# Override any of these in the matrix's `env:` mapping or in your shell before `sbatch`.

# Rendezvous: the first node of the allocation is the master.
export MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "${SLURM_JOB_NODELIST:-localhost}" | head -n 1)}
# One port per job, so jobs sharing a node (the emulated cluster) do not collide.
export MASTER_PORT=${MASTER_PORT:-$((20000 + ${SLURM_JOB_ID:-0} % 20000))}
export GPUS_PER_NODE=${GPUS_PER_NODE:-8}
export ZEPPELIN_PYTHON=${ZEPPELIN_PYTHON:-python}

# Megatron: one CUDA connection keeps TP/SP communication kernels ordered before compute.
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}

# NCCL over InfiniBand/RoCE. Name the compute HCAs (GPU->NIC affinity comes from `nvidia-smi topo -m`;
# Zeppelin reads the same map, see megatron_zeppelin/spec/discovery.py).
export NCCL_IB_HCA=${NCCL_IB_HCA:-mlx5}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-^lo,docker}
export NCCL_NET_GDR_LEVEL=${NCCL_NET_GDR_LEVEL:-PHB}   # GPUDirect RDMA through the GPU's PCIe switch
export NCCL_IB_GID_INDEX=${NCCL_IB_GID_INDEX:-3}       # RoCE v2 (clusters A and B); unset on InfiniBand
# Keep rings/trees on their rail (same NIC index across nodes): Zeppelin's routed transfers are same-rail.
export NCCL_CROSS_NIC=${NCCL_CROSS_NIC:-0}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

zeppelin_launch() {
  # torchrun on every node; the node rank comes from SLURM. printf %q keeps each argument quoted.
  local cmd
  cmd=$(printf '%q ' "$@")
  srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c "$ZEPPELIN_PYTHON -m torch.distributed.run \
    --nnodes=\$SLURM_NNODES --nproc-per-node=$GPUS_PER_NODE --node-rank=\$SLURM_NODEID \
    --rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT $cmd"
}

zeppelin_srun() {
  # One SLURM task per rank (also the emulated nodes of one machine: "node" = rank // GPUS_PER_NODE).
  srun --kill-on-bad-exit=1 bash -c 'export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS \
    LOCAL_RANK=$((SLURM_PROCID % GPUS_PER_NODE)) LOCAL_WORLD_SIZE=$GPUS_PER_NODE \
    GROUP_RANK=$((SLURM_PROCID / GPUS_PER_NODE)); exec "$ZEPPELIN_PYTHON" "$@"' zeppelin_srun "$@"
}
