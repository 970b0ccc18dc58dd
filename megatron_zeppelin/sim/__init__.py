"""Simulator: replays a Plan's schedule against a hardware profile (one training iteration), and the
benchmark matrix built on it. See iteration.py for what is modelled."""
