"""`zeppelin calibrate`: measure attention by length, GEMM rate and link bandwidth into a profile YAML.

--device cpu: torch's CPU flash-attention kernels (the engine's CPU path), float32 GEMMs on the
model's shapes, and gloo ping-pong between two local processes (used for both link classes).
--device cuda: the engine's CUDA kernels in bf16, GEMMs, and NCCL ping-pong when launched with
torchrun over >= 2 GPUs (rank 0 <-> 1 inside a node; rank 0 <-> first rank of node 2 across nodes);
links not measured are copied from --base and listed under ``assumed`` in the YAML.
"""

from __future__ import annotations

import json
import os

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.token_counts import token_count


def add_parser(sub):
    p = sub.add_parser("calibrate", help="measure this machine into a hardware profile YAML",
                       description=__doc__)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--model", default="", help="model whose attention/GEMM shapes are measured "
                                              "(default: tiny on cpu, llama-7b on cuda)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (heads per rank)")
    p.add_argument("--lengths", type=token_count, nargs="+", default=None, help="document lengths to time (4K, ...)")
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node written to the profile")
    p.add_argument("--nics-per-node", type=int, default=0, help="NICs per node written to the profile")
    p.add_argument("--base", default="h200", help="profile copied for anything not measured (default h200)")
    p.add_argument("--name", default="", help="profile name (default: local-<device>)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement (the fastest is kept)")
    p.add_argument("--retries", type=int, default=2,
                   help="rounds of measuring noisy or non-monotonic lengths again before warning (default 2)")
    p.add_argument("--out", default="", help="profile YAML path (default out/<name>.yaml)")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from megatron_zeppelin.calibrate.measure import measure_profile
    from megatron_zeppelin.spec.model import load_model
    from megatron_zeppelin.spec.hardware import load_profile

    cuda = args.device == "cuda"
    for flag, v, least in (("--repeats", args.repeats, 1), ("--retries", args.retries, 0), ("--tp", args.tp, 1),
                           ("--gpus-per-node", args.gpus_per_node, 0), ("--nics-per-node", args.nics_per_node, 0)):
        if v < least:
            raise ZeppelinError(f"{flag} must be >= {least}, got {v}")
    if args.lengths and min(args.lengths) < 1:
        raise ZeppelinError(f"--lengths must be positive, got {min(args.lengths)}")
    if cuda and not torch.cuda.is_available():
        raise ZeppelinError("--device cuda but no CUDA device is visible (use --device cpu)")
    m = load_model(args.model or ("llama-7b" if cuda else "tiny"))
    if m.heads % args.tp or m.kv_heads % args.tp:
        raise ZeppelinError(f"--tp {args.tp} does not divide {m.name}'s {m.heads} attention heads and {m.kv_heads} "
                            "KV heads (set --tp to a common divisor)")
    load_profile(args.base, "--base")  # a bad --base fails now, not after minutes of measuring
    name = args.name or f"local-{args.device}"
    out = args.out or os.path.join("out", f"{name}.yaml")
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    except OSError as e:
        raise ZeppelinError(f"cannot write --out {out}: {e.strerror}") from None
    prof, meas = measure_profile(m, args.device, args.tp, args.lengths, args.repeats, args.gpus_per_node,
                                 args.nics_per_node, args.base, name, log=lambda s: print(s, flush=True),
                                 retries=args.retries)
    if cuda:
        import torch.distributed as dist
        if dist.is_initialized() and dist.get_rank() != 0:
            return 0
    prof.save(out)
    with open(os.path.splitext(out)[0] + ".measurements.json", "w") as f:
        json.dump(meas, f, indent=2)
    print(f"[calibrate] wrote {out} (use it as --cluster {out})")
    for w in meas["warnings"]:
        print(f"[calibrate] warning: still noisy after {args.retries} more round(s): {w}")
    if meas["warnings"]:
        print("[calibrate] warning: the profile's rates may mislead the planner: calibrate again on an idle machine "
              "(or with more --repeats); the measurements JSON lists them under 'warnings'")
    return 0
