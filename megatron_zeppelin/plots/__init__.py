"""Plots (PNG, matplotlib with the Agg backend) of a plan, the benchmark matrix and the DP study:
imported lazily, matplotlib is slow to import."""
