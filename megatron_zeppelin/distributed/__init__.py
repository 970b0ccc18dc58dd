"""Distributed runtime: process groups, communication primitives, schedule executor, launcher."""
