"""Baseline strategies, each as its authors describe it, returning the same Placement/Plan types.
Importing the package registers them (planner/strategies.py)."""

from megatron_zeppelin.planner.baselines import allgather_cp, dynamic_cp, hybrid_dp, packed_dp, static_cp  # noqa: F401 -- they register

__all__ = ["allgather_cp", "dynamic_cp", "hybrid_dp", "packed_dp", "static_cp"]
