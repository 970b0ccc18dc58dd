"""The routing layer's flag shared by ``zeppelin plan`` and ``zeppelin simulate``: the relay chunk
size (spec/config.py ``relay_chunk_bytes``; the Megatron entry's ``--zeppelin-relay-chunk-bytes`` is
integration/args.py's, which imports nothing from here).

>>> import argparse
>>> p = argparse.ArgumentParser(); add_relay_chunk_flag(p)
>>> p.parse_args([]).relay_chunk_bytes, p.parse_args(["--zeppelin-relay-chunk-bytes", "0"]).relay_chunk_bytes
(None, 0)
"""

from __future__ import annotations

FLAG = "--zeppelin-relay-chunk-bytes"
HELP = ("Largest chunk (bytes) of a routed piece: the relays forward chunk by chunk, so chunk i+1's dispatch "
        "overlaps chunk i's transfer and chunk i-1's combine (docs/routing.md); 0 = unpipelined; "
        "default: the cluster profile's relay_chunk_bytes (2 MiB on the GPU presets).")


def add_relay_chunk_flag(group) -> None:
    """Add ``--relay-chunk-bytes`` / ``--zeppelin-relay-chunk-bytes`` to ``group`` (ZeppelinConfig's
    ``relay_chunk_bytes``, which refuses a negative value naming the flag)."""
    group.add_argument("--relay-chunk-bytes", FLAG, dest="relay_chunk_bytes", type=int, default=None,
                       metavar="BYTES", help=HELP)
