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

from ..errors import ZeppelinError


def add_parser(sub):
    p = sub.add_parser("calibrate", help="measure this machine into a hardware profile YAML",
                       description=__doc__)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--model", default="", help="model whose attention/GEMM shapes are measured "
                                              "(default: tiny on cpu, llama-7b on cuda)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (heads per rank)")
    p.add_argument("--lengths", type=int, nargs="+", default=None, help="document lengths to time")
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node written to the profile")
    p.add_argument("--nics-per-node", type=int, default=0, help="NICs per node written to the profile")
    p.add_argument("--base", default="h200", help="profile copied for anything not measured (default h200)")
    p.add_argument("--name", default="", help="profile name (default: local-<device>)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="", help="profile YAML path (default out/<name>.yaml)")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from ..calibrate.measure import measure_profile
    from ..model_spec import load_model

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise ZeppelinError("--device cuda but no CUDA device is visible (use --device cpu)")
    m = load_model(args.model or ("llama-7b" if cuda else "tiny"))
    name = args.name or f"local-{args.device}"
    out = args.out or os.path.join("out", f"{name}.yaml")
    prof, meas = measure_profile(m, args.device, args.tp, args.lengths, args.repeats, args.gpus_per_node,
                                 args.nics_per_node, args.base, name, log=lambda s: print(s, flush=True))
    if cuda:
        import torch.distributed as dist
        if dist.is_initialized() and dist.get_rank() != 0:
            return 0
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    prof.save(out)
    with open(os.path.splitext(out)[0] + ".measurements.json", "w") as f:
        json.dump(meas, f, indent=2)
    print(f"[calibrate] wrote {out} (use it as --cluster {out})")
    return 0
