"""The paper's hierarchical sequence partitioner: length classes from the cost model's
crossovers (thresholds), the greedy placement (partition), and longest-processing-time fill (lpt)."""
