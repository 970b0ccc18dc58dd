"""Flag groups shared by several sub-commands (the workload; the domain a plan models)."""
