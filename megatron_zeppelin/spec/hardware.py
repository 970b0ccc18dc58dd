"""HardwareProfile: the costs of one machine type (megatron_zeppelin/presets/clusters/*.yaml).

Attention throughput depends on the length of the attended block: short documents run far below
peak (tile quantization, launch overhead). Between table points the rate is interpolated linearly in
log2(length); outside the table it is clamped, except below ``attention.tile_tokens`` where it falls
in proportion to the length (CostModel.attn_rate).

>>> p = HardwareProfile(name="toy", gpu="toy", gemm_tflops=100.0, attn_seqlen=(512, 2048),
...                     attn_fwd_tflops=(50.0, 100.0), attn_bwd_tflops=(40.0, 80.0),
...                     nvlink_GBps=100.0, nvlink_latency_us=2.0, nic_GBps=10.0, nic_latency_us=10.0,
...                     gpus_per_node=8, nics_per_node=4)
>>> p.attn_tflops(1024), p.attn_tflops(4096, backward=True)
(75.0, 80.0)
"""

from __future__ import annotations

from megatron_zeppelin.errors import ZeppelinError

import difflib
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Tuple

import yaml

from megatron_zeppelin.spec.yaml_load import safe_load

from megatron_zeppelin.spec.words import Link
from megatron_zeppelin.presets import preset_dir

CLUSTERS_DIR = preset_dir("clusters")
ALIASES = {"a": "a800", "b": "h800", "c": "h200"}


class ProfileError(ZeppelinError):
    pass


@dataclass(frozen=True)
class NetworkLevel:
    """A network level above the NICs' own (e.g. the spine of a rail-optimised fabric, joining
    leaf groups): its link class ``name``, GB/s per NIC per direction, latency, and how many
    consecutive nodes one of its domains joins (0: all nodes). A message between nodes that no
    lower level joins takes this level's link: it leaves on the sender's NIC as any network hop."""
    name: str
    GBps: float
    latency_us: float
    nodes: int = 0


# What only ranks sharing one host CPU have (spec/host.py HostModel, the CPU validation's): a
# profile YAML keeps them in its own host: section, never here.
HOST_KEYS = ("host_cores", "host_copy_GBps", "host_post_us", "host_wait_us", "host_land_GBps", "host_pack_GBps")
RELAY_CHUNK_BYTES = 2 << 20  # the GPU presets' relay chunk (HardwareProfile.relay_chunk_bytes)
SPLIT_KEYS = ("split_fwd_us", "split_bwd_us", "split_row_fwd_us", "split_row_bwd_us")  # were YAML attention.*


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    gpu: str
    gemm_tflops: float
    attn_seqlen: Tuple[int, ...]
    attn_fwd_tflops: Tuple[float, ...]
    attn_bwd_tflops: Tuple[float, ...]
    nvlink_GBps: float  # per GPU, per direction, achieved
    nvlink_latency_us: float
    nic_GBps: float  # per NIC, per direction, achieved
    nic_latency_us: float
    gpus_per_node: int = 8
    nics_per_node: int = 8
    gpu_to_nic: Tuple[int, ...] = ()
    memory_GB: float = 80.0
    assumed: Tuple[str, ...] = field(default=())  # fields that are assumptions, not published/measured
    # Fixed seconds per attention kernel call (launch, cu_seqlens, LSE merge; the engine makes one
    # call per rank per Compute of the layer program, every block of it packed), and per *sequence*
    # inside a call (one query chunk with every key block it attends in that call: the kernels merge
    # them, attention/kernels/pieces.py; pairing segments, masks, slicing the K/V message), forward
    # and backward, on top of FLOPs / rate; per call, the GPU presets state an assumed launch cost
    # (attention.call_fwd_us / call_bwd_us) and no per-sequence cost (the rate tables hold it); the
    # CPU profile's are measured by `zeppelin bench --validate-cpu`.
    attn_call_fwd_us: float = 0.0
    attn_call_bwd_us: float = 0.0
    attn_seq_fwd_us: float = 0.0
    attn_seq_bwd_us: float = 0.0
    # Throughput of *full* (non-causal) blocks by the same lengths, for the simulator's ring steps
    # (off-diagonal zigzag blocks); empty = the causal tables above (FLOPs count the same either way:
    # right where a kernel skips the masked tiles, as GPU flash kernels do). Torch's CPU flash kernel
    # costs a causal block of <= 512 tokens as much as a full one, so there it is ~2x the causal rate.
    attn_full_fwd_tflops: Tuple[float, ...] = ()
    attn_full_bwd_tflops: Tuple[float, ...] = ()
    # Cluster levels above the node (YAML ``nic.nodes`` and ``levels``): the NIC level joins groups
    # of ``nic_nodes`` consecutive nodes (0: all nodes, the usual two-level cluster); each further
    # level (innermost first) joins groups of its ``nodes``, a multiple of the level below's.
    nic_nodes: int = 0
    levels: Tuple[NetworkLevel, ...] = ()
    # Largest chunk of a routed piece (YAML ``relay_chunk_bytes``; 0: unpipelined): the relays forward
    # chunk by chunk, so chunk i+1's dispatch overlaps chunk i's transfer and chunk i-1's combine
    # (planner/program.py ``step_order``). Each chunk pays its links' latency, so smaller is not
    # better: 2 MiB gives the least predicted routed time of a 64K-document ring message on a800 and
    # h200 among 256 KiB..8 MiB (docs/routing.md, results/relay/).
    relay_chunk_bytes: int = RELAY_CHUNK_BYTES
    # How a kernel call is priced (YAML ``attention.by_sequence``): True, each sequence of the call
    # (a query chunk with every key it attends there) at the table of its mask (causal, or full when
    # it has no causal key run) at its number of keys: FlashAttention's length curves are measured
    # so (one seqlen of queries and keys per batch entry); False, each block at its own length, as
    # `zeppelin calibrate` measures the CPU kernel's blocks.
    attn_by_sequence: bool = False
    # Below ``attention.tile_tokens`` keys the rate falls in proportion to the keys (a shorter
    # sequence still runs a whole query tile and key loop, so its time stops shrinking with its
    # FLOPs); 0: the rate is clamped at the table's first point, as the CPU profiles measure.
    attn_tile_tokens: int = 0
    # Fixed seconds of every point-to-point message (each hop: a routed piece is three) on top of
    # its link's latency (YAML ``message_us``): the NCCL op's launch and, at a relay, the proxy's
    # handoff; the collectives (TP, DP all-reduces) keep the link latency alone.
    message_us: float = 0.0
    # Fraction by which a compute kernel slows while an NCCL exchange of its rank is in flight (YAML
    # ``overlap_slowdown``): NCCL's kernels take SMs (planner/program.py AttentionWork applies it).
    overlap_slowdown: float = 0.0

    def __post_init__(self):
        for f in ("attn_seqlen", "attn_fwd_tflops", "attn_bwd_tflops", "gpu_to_nic", "assumed",
                  "attn_full_fwd_tflops", "attn_full_bwd_tflops", "levels"):
            object.__setattr__(self, f, tuple(getattr(self, f)))
        self._check_levels()
        n = len(self.attn_seqlen)
        if n == 0 or len(self.attn_fwd_tflops) != n or len(self.attn_bwd_tflops) != n:
            raise ProfileError(f"profile {self.name}: attention.seqlen, fwd_tflops and bwd_tflops must be "
                               "non-empty lists of the same length")
        if list(self.attn_seqlen) != sorted(set(self.attn_seqlen)) or self.attn_seqlen[0] < 1:
            raise ProfileError(f"profile {self.name}: attention.seqlen must be strictly increasing and positive")
        for f in ("gemm_tflops", "nvlink_GBps", "nic_GBps"):
            if not getattr(self, f) > 0:
                raise ProfileError(f"profile {self.name}: {f} must be > 0")
        if min(self.attn_fwd_tflops) <= 0 or min(self.attn_bwd_tflops) <= 0:
            raise ProfileError(f"profile {self.name}: attention throughputs must be > 0")
        for f in ("attn_full_fwd_tflops", "attn_full_bwd_tflops"):
            v = getattr(self, f)
            if v and (len(v) != n or min(v) <= 0):
                raise ProfileError(f"profile {self.name}: attention.{f[5:]} must be empty or one positive "
                                   "throughput per attention.seqlen")
        if self.nvlink_latency_us < 0 or self.nic_latency_us < 0:
            raise ProfileError(f"profile {self.name}: latencies must be >= 0")
        if self.relay_chunk_bytes < 0:
            raise ProfileError(f"profile {self.name}: relay_chunk_bytes must be >= 0 (0: unpipelined relays)")
        if self.message_us < 0 or self.attn_tile_tokens < 0 or not 0 <= self.overlap_slowdown < 1:
            raise ProfileError(f"profile {self.name}: message_us and attention.tile_tokens must be >= 0 and "
                               "overlap_slowdown in [0, 1)")

    def _check_levels(self) -> None:
        names, below = {Link.NVLINK, Link.NIC}, self.nic_nodes
        for lv in self.levels:
            if lv.name in names or not lv.name.isidentifier():
                raise ProfileError(f"profile {self.name}: level '{lv.name}' must have a new identifier for a name")
            names.add(lv.name)
            if not lv.GBps > 0 or lv.latency_us < 0:
                raise ProfileError(f"profile {self.name}: level {lv.name} needs GBps > 0 and latency_us >= 0")
            if below == 0 or lv.nodes < 0 or (lv.nodes and lv.nodes % below):
                raise ProfileError(f"profile {self.name}: level {lv.name} joins {lv.nodes} nodes; the level below "
                                   f"joins {below or 'all'}: each level's domain must be a multiple of the one below")
            below = lv.nodes
        if self.nic_nodes < 0:
            raise ProfileError(f"profile {self.name}: nic.nodes must be >= 0 (0: all nodes)")

    @property
    def links(self):
        """Per link class, innermost first (nvlink, nic, then ``levels``): (GB/s per direction, latency in us)."""
        out = {Link.NVLINK: (self.nvlink_GBps, self.nvlink_latency_us), Link.NIC: (self.nic_GBps, self.nic_latency_us)}
        out.update((lv.name, (lv.GBps, lv.latency_us)) for lv in self.levels)
        return out

    @property
    def spans(self) -> Tuple[int, ...]:
        """Nodes one domain of each network level joins (nic first; 0: all), for Topology.level_of."""
        return (self.nic_nodes,) + tuple(lv.nodes for lv in self.levels)

    def attn_tflops(self, length: float, backward: bool = False) -> float:
        xs, ys = self.attn_seqlen, (self.attn_bwd_tflops if backward else self.attn_fwd_tflops)
        if length <= xs[0]:
            return ys[0]
        if length >= xs[-1]:
            return ys[-1]
        x = math.log2(length)
        for i in range(1, len(xs)):
            if length <= xs[i]:
                x0, x1 = math.log2(xs[i - 1]), math.log2(xs[i])
                return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)
        return ys[-1]  # unreachable

    # --- (de)serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        out = {k: d[k] for k in ("name", "gpu", "memory_GB", "gpus_per_node", "nics_per_node")}
        out["gpu_to_nic"] = list(self.gpu_to_nic)
        out["gemm_tflops"] = self.gemm_tflops
        out["attention"] = {"seqlen": list(self.attn_seqlen), "fwd_tflops": list(self.attn_fwd_tflops),
                            "bwd_tflops": list(self.attn_bwd_tflops)}
        # The YAML keeps the plain words (yaml.safe_dump writes no enum members).
        out["nvlink"] = {"GBps": self.nvlink_GBps, "latency_us": self.nvlink_latency_us}
        out["nic"] = {"GBps": self.nic_GBps, "latency_us": self.nic_latency_us}
        if self.nic_nodes:
            out["nic"]["nodes"] = self.nic_nodes
        if self.levels:
            out["levels"] = [asdict(lv) for lv in self.levels]
        if self.relay_chunk_bytes != RELAY_CHUNK_BYTES:
            out["relay_chunk_bytes"] = self.relay_chunk_bytes
        out["assumed"] = list(self.assumed)
        if self.attn_call_fwd_us or self.attn_call_bwd_us:
            out["attention"].update(call_fwd_us=self.attn_call_fwd_us, call_bwd_us=self.attn_call_bwd_us)
        if self.attn_seq_fwd_us or self.attn_seq_bwd_us:
            out["attention"].update(seq_fwd_us=self.attn_seq_fwd_us, seq_bwd_us=self.attn_seq_bwd_us)
        if self.attn_full_fwd_tflops:
            out["attention"].update(full_fwd_tflops=list(self.attn_full_fwd_tflops),
                                    full_bwd_tflops=list(self.attn_full_bwd_tflops))
        if self.attn_by_sequence:
            out["attention"]["by_sequence"] = True
        if self.attn_tile_tokens:
            out["attention"]["tile_tokens"] = self.attn_tile_tokens
        if self.message_us:
            out["message_us"] = self.message_us
        if self.overlap_slowdown:
            out["overlap_slowdown"] = self.overlap_slowdown
        return out

    @classmethod
    def from_dict(cls, d: dict, source: str = "<dict>") -> "HardwareProfile":
        try:
            att, nv, nic = d["attention"], d["nvlink"], d["nic"]
            if "block_fwd_us" in att or "block_bwd_us" in att:
                raise ProfileError(f"profile {source}: attention.block_fwd_us / block_bwd_us (per block) are now "
                                   "seq_fwd_us / seq_bwd_us (per sequence of a kernel call): recalibrate it "
                                   "(zeppelin bench --validate-cpu)")
            moved = [k for k in HOST_KEYS if k in d] + [f"attention.{k}" for k in SPLIT_KEYS if k in att]
            if moved:
                raise ProfileError(f"profile {source}: {', '.join(moved)} belong to a CPU host, not a profile: "
                                   "they are now its host: section (spec/host.py; recalibrate with "
                                   "zeppelin bench --validate-cpu)")
            return cls(
                name=str(d["name"]), gpu=str(d.get("gpu", d["name"])), gemm_tflops=float(d["gemm_tflops"]),
                attn_seqlen=tuple(int(x) for x in att["seqlen"]),
                attn_fwd_tflops=tuple(float(x) for x in att["fwd_tflops"]),
                attn_bwd_tflops=tuple(float(x) for x in att["bwd_tflops"]),
                nvlink_GBps=float(nv["GBps"]), nvlink_latency_us=float(nv["latency_us"]),
                nic_GBps=float(nic["GBps"]), nic_latency_us=float(nic["latency_us"]),
                gpus_per_node=int(d.get("gpus_per_node", 8)), nics_per_node=int(d.get("nics_per_node", 8)),
                gpu_to_nic=tuple(int(x) for x in d.get("gpu_to_nic", ())),
                memory_GB=float(d.get("memory_GB", 80.0)), assumed=tuple(d.get("assumed", ())),
                attn_call_fwd_us=float(att.get("call_fwd_us", 0.0)),
                attn_call_bwd_us=float(att.get("call_bwd_us", 0.0)),
                attn_seq_fwd_us=float(att.get("seq_fwd_us", 0.0)),
                attn_seq_bwd_us=float(att.get("seq_bwd_us", 0.0)),
                attn_full_fwd_tflops=tuple(float(x) for x in att.get("full_fwd_tflops", ())),
                attn_full_bwd_tflops=tuple(float(x) for x in att.get("full_bwd_tflops", ())),
                attn_by_sequence=bool(att.get("by_sequence", False)),
                attn_tile_tokens=int(att.get("tile_tokens", 0)),
                message_us=float(d.get("message_us", 0.0)),
                overlap_slowdown=float(d.get("overlap_slowdown", 0.0)),
                nic_nodes=int(nic.get("nodes", 0)),
                relay_chunk_bytes=int(d.get("relay_chunk_bytes", RELAY_CHUNK_BYTES)),
                levels=tuple(NetworkLevel(str(lv["name"]), float(lv["GBps"]), float(lv["latency_us"]),
                                          int(lv.get("nodes", 0))) for lv in d.get("levels", ())))
        except ProfileError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"malformed profile {source}: missing or bad field {e}") from None

    def save(self, path: str, host=None) -> None:
        """The profile's YAML; ``host`` (a spec/host.py HostModel: a calibrated CPU profile's) as its
        own ``host:`` section, which ``load_profile`` ignores and ``load_host`` reads."""
        d = self.to_dict()
        if host is not None:
            d["host"] = host.to_dict()
        with open(path, "w") as f:
            yaml.safe_dump(d, f, sort_keys=False)


def load_profile(name_or_path: str, flag: str = "--cluster") -> HardwareProfile:
    """A preset (``a800``/``h100``/``h200``/``h800``, or the paper's cluster letters ``a``/``b``/``c``) or a
    YAML path; an unknown one is an error naming ``flag``, the presets and how to write a profile.

    >>> load_profile("h100x")
    Traceback (most recent call last):
    ...
    megatron_zeppelin.spec.hardware.ProfileError: unknown cluster 'h100x' (did you mean h100?): set --cluster to a preset (a800, h100, h200, h800; a/b/c: the paper's clusters A/B/C) or a profile YAML path; docs/cluster.md ("Your own cluster") shows how to write one
    """
    path = name_or_path
    if not os.path.exists(path):
        path = os.path.join(CLUSTERS_DIR, f"{ALIASES.get(name_or_path.lower(), name_or_path)}.yaml")
    if not os.path.exists(path):
        known = sorted(f[:-5] for f in os.listdir(CLUSTERS_DIR) if f.endswith(".yaml"))
        close = difflib.get_close_matches(name_or_path.lower(), known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ProfileError(f"unknown cluster '{name_or_path}'{hint}: set {flag} to a preset ({', '.join(known)}; "
                           "a/b/c: the paper's clusters A/B/C) or a profile YAML path; docs/cluster.md "
                           '("Your own cluster") shows how to write one')
    try:
        with open(path) as f:
            d = safe_load(f)
    except yaml.YAMLError as e:
        raise ProfileError(f"malformed profile {path}: {' '.join(str(e).split())}") from None
    if not isinstance(d, dict):
        raise ProfileError(f"malformed profile {path}: expected a mapping")
    return HardwareProfile.from_dict(d, source=path)
