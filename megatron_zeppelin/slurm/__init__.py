"""SLURM jobs for a run matrix (Zeppelin and the stock Megatron baselines), their Megatron flags, and
the collection of their results."""
