"""CpuProfile: what the CPU validation calibrates, a HardwareProfile and the HostModel of its ranks.

The profile is what any machine has (rates, links, fixed costs per kernel call and per sequence);
the host (spec/host.py) is what only ranks sharing one CPU add. They are kept apart so that the
product never sees a host term: the validation passes ``host`` to the planner and the simulator
itself, and the YAML keeps it in a ``host:`` section that ``load_profile`` ignores (``zeppelin plan
--cluster cpu-w2.yaml`` plans with the profile alone, as on a machine whose ranks do not share a CPU).

>>> from megatron_zeppelin.planner.testing import TOY_PROFILE
>>> from megatron_zeppelin.spec.host import HostModel
>>> c = CpuProfile(TOY_PROFILE, HostModel(cores=2.0, post_us=300.0))
>>> d = c.to_dict()
>>> d["host"]["cores"], CpuProfile.from_dict(d) == c
(2.0, True)
"""

from __future__ import annotations

from typing import NamedTuple

from megatron_zeppelin.spec.hardware import HardwareProfile, load_profile
from megatron_zeppelin.spec.host import HostModel, load_host


class CpuProfile(NamedTuple):
    profile: HardwareProfile
    host: HostModel

    def to_dict(self) -> dict:
        """The profile's dict with the host's as its ``host`` section (the YAML's and the JSON logs')."""
        return {**self.profile.to_dict(), "host": self.host.to_dict()}

    @classmethod
    def from_dict(cls, d: dict, source: str = "<dict>") -> "CpuProfile":
        return cls(HardwareProfile.from_dict(d, source), HostModel.from_dict(d.get("host", {}), source))

    def save(self, path: str) -> None:
        self.profile.save(path, host=self.host)

    @classmethod
    def load(cls, path: str) -> "CpuProfile":
        """A calibrated CPU profile's YAML; a profile without a ``host:`` section gets an empty host
        (ranks that share nothing)."""
        return cls(load_profile(path), load_host(path) or HostModel())
