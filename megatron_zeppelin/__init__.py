"""megatron_zeppelin: Zeppelin (arXiv 2509.21841) as a Megatron-Core plugin.

Hierarchical sequence partitioning (local / intra-node / inter-node documents), an attention engine
that runs each class on its own rings, a routing layer that spreads inter-node traffic over every NIC,
and a remapping layer that token-balances the linear modules. docs/architecture.md has the words, the
Plan, the parts (the package's layers) and the layer program; docs/contributing.md where new code goes.
"""

__version__ = "0.1.0"
