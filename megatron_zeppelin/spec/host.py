"""HostModel: what ranks sharing one host CPU add to a HardwareProfile (the CPU validation only).

On GPUs every rank has its own device and the host runs ahead of it, so the engine's own CPU per
exchange hides behind the kernels and every kernel's seconds are fixed: GPU profiles
(presets/clusters/*.yaml) carry none of this, and the cost model, the prediction and the
simulator take a HostModel as an explicit optional argument that is None there. The CPU validation
(validation/concurrent.py) measures one inside its own spawned run and passes it in wherever it
plans or simulates, so the simulator can be checked against engine runs whose ranks are processes
of one CPU: they share its cores, gloo copies every message on both ends, the engine spends CPU per
Post and Wait and packing its own rows, and the CPU kernel, which knows only top-left causal masks,
runs a query chunk with full keys then its causal run as two sequences and a merge (a *split*).

Its YAML is the ``host:`` section of a calibrated CPU profile (``HostModel.from_dict``; only CPU
profiles have one, and ``load_profile`` ignores it).

>>> h = HostModel(cores=2.0, wait_us=100.0, land_GBps=2.0, pack_GBps=2.0)
>>> round(float(h.wait_s(4e6)) * 1e6, 6)   # 100 us + 4 MB at 2 GB/s
2100.0
>>> round(float(h.pack_s(128_000)) * 1e6, 6)   # 128 kB of own K/V rows at 2 GB/s
64.0
>>> HostModel.from_dict(h.to_dict()) == h
True
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from typing import Optional

import numpy as np
from megatron_zeppelin.spec.yaml_load import safe_load

from megatron_zeppelin.errors import ZeppelinError


class HostError(ZeppelinError):
    pass


@dataclass(frozen=True)
class HostModel:
    # Cores of the host that all ranks' compute shares (processor sharing: with n ranks computing,
    # each runs at min(1, cores / n) of the profile's single-core rates; sim/host.py). 0 = ranks do
    # not share compute. Calibrated as the affinity mask's cores, or, with more ranks than cores,
    # the compute they got running at once if less (every switch between ranks costs cache refills).
    cores: float = 0.0
    # Bytes per second one core copies through the transport (gloo over TCP copies every message on
    # both ends): each message takes bytes / rate seconds of CPU at its sender and at its receiver,
    # shared with the compute (only with cores > 0). 0 = messages take no CPU.
    copy_GBps: float = 0.0
    # The engine's own CPU per Post and per Wait of the layer program on each rank the exchange
    # involves, outside any kernel call: a fixed part (building and posting the exchange; waiting),
    # and at a Wait the bytes of the messages ending at the rank at land_GBps (landing the rows in
    # place and adding them up). 0 = none.
    post_us: float = 0.0
    wait_us: float = 0.0
    land_GBps: float = 0.0
    # The engine's CPU packing a rank's own rows of each of its rings into the K/V message it holds,
    # at the start of every pass (attention/runner.py LayerRun: a row gather and a concatenation).
    pack_GBps: float = 0.0
    # What a split sequence (a query chunk with full keys then its causal run, which the CPU kernel,
    # attention/kernels/cpu.py, runs as two sequences and a merge) adds beyond its two sequences:
    # a fixed part and a part per query row, forward and backward (measured against the model's own
    # price of the same blocks: validation/concurrent.py ``with_splits``).
    split_fwd_us: float = 0.0
    split_bwd_us: float = 0.0
    split_row_fwd_us: float = 0.0
    split_row_bwd_us: float = 0.0

    def __post_init__(self):
        for f in fields(self):
            if not getattr(self, f.name) >= 0:  # nan too
                raise HostError(f"host.{f.name} must be >= 0 (0: none), got {getattr(self, f.name)}: "
                                "set it in the profile's host: section (zeppelin bench --validate-cpu writes it)")

    # --- the engine's CPU per exchange and per pass --------------------------------------------
    @property
    def charges_engine(self) -> bool:
        """Whether the engine's Posts, Waits or packing cost anything (the simulator adds no
        zero-second tasks otherwise)."""
        return bool(self.post_us or self.wait_us or self.land_GBps or self.pack_GBps)

    def post_s(self) -> float:
        """CPU seconds of one Post of the layer program on each rank its exchange involves."""
        return self.post_us * 1e-6

    def wait_s(self, landed_bytes=0.0):
        """CPU seconds of one Wait on a rank its exchange involves, once its messages are in:
        ``wait_us`` plus ``landed_bytes`` (of the messages ending at the rank: scalar or array)
        at ``land_GBps``."""
        land = np.asarray(landed_bytes, dtype=np.float64) / (self.land_GBps * 1e9) if self.land_GBps else 0.0
        return self.wait_us * 1e-6 + land

    def pack_s(self, nbytes):
        """CPU seconds with which a rank packs ``nbytes`` (scalar or array) of its own K/V rows of
        its rings into messages at the start of a pass."""
        nbytes = np.asarray(nbytes, dtype=np.float64)
        return nbytes / (self.pack_GBps * 1e9) if self.pack_GBps else np.zeros_like(nbytes)

    # --- the CPU kernel's split sequences -----------------------------------------------------
    def split_s(self, n, rows, backward: bool = False):
        """What ``n`` split sequences of ``rows`` query rows in all add beyond their two sequences
        each. Vectorised over n and rows.

        >>> h = HostModel(split_fwd_us=30.0, split_row_fwd_us=0.5)
        >>> round(float(h.split_s(2, 100)) * 1e6, 6)  # 2 x 30 + 100 x 0.5 us
        110.0
        """
        fixed, row = ((self.split_bwd_us, self.split_row_bwd_us) if backward
                      else (self.split_fwd_us, self.split_row_fwd_us))
        return (np.asarray(n, dtype=np.float64) * fixed + np.asarray(rows, dtype=np.float64) * row) * 1e-6

    # --- the transport's copies -----------------------------------------------------------------
    @property
    def copy_Bps(self) -> float:
        """Bytes per CPU second of the transport's copies, 0 where they are free or compute is not shared."""
        return self.copy_GBps * 1e9 if self.cores > 0 else 0.0

    # --- (de)serialisation: the ``host:`` section of a CPU profile's YAML ----------------------
    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, source: str = "<dict>") -> "HostModel":
        known = {f.name for f in fields(cls)}
        if not isinstance(d, dict) or set(d) - known:
            extra = sorted(set(d) - known) if isinstance(d, dict) else d
            raise HostError(f"profile {source}: unknown host: field(s) {extra} (known: {sorted(known)})")
        try:
            return cls(**{k: float(v) for k, v in d.items()})
        except (TypeError, ValueError) as e:
            raise HostError(f"malformed profile {source}: bad host: field ({e})") from None


def load_host(path: str) -> Optional[HostModel]:
    """The ``host:`` section of a profile YAML (a calibrated CPU profile's), or None where it has none."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        d = safe_load(f)
    section = d.get("host") if isinstance(d, dict) else None
    return None if section is None else HostModel.from_dict(section, source=path)
