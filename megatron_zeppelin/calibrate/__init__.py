"""Calibration: measure this machine's attention, GEMM and link costs into a HardwareProfile YAML
that ``zeppelin plan`` and ``zeppelin simulate`` accept (``--cluster PATH``)."""
