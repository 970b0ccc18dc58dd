"""Plots (PNG, matplotlib with the Agg backend): imported lazily, matplotlib is slow to import."""
