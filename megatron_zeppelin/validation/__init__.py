"""CPU validation of the simulator: measured engine runs on this host against simulated ones, and the
host models (core sharing, heap) only that validation uses."""
