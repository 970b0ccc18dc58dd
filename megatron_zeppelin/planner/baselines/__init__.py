"""Baseline strategies, each as its authors describe it, returning the same Placement/Plan types."""
