"""``zeppelin advise``: which parallelism, batch split and recompute to run, and the Megatron line for it."""
