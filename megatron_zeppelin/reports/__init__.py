"""Text and JSON reports the sub-commands print: a plan, a simulation, the benchmark matrix, the DP study."""
