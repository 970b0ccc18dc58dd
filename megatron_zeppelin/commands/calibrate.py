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

    from ..calibrate.compute import attention_rates, gemm_rate
    from ..calibrate.links import cpu_link, ping_pong
    from ..calibrate.profile_builder import build_profile
    from ..model_spec import load_model
    from ..profile import load_profile

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise ZeppelinError("--device cuda but no CUDA device is visible (use --device cpu)")
    m = load_model(args.model or ("llama-7b" if cuda else "tiny"))
    heads, kvh = max(1, m.heads // args.tp), max(1, m.kv_heads // args.tp)
    lengths = args.lengths or ([512, 1024, 2048, 4096, 8192, 16384] if cuda else [128, 256, 512, 1024, 2048])
    dtype = torch.bfloat16 if cuda else torch.float32
    name = args.name or f"local-{args.device}"
    out = args.out or os.path.join("out", f"{name}.yaml")
    dev = "cuda" if cuda else "cpu"
    print(f"[calibrate] attention: {m.name} ({heads} heads, {kvh} KV heads, head dim {m.head_dim}), "
          f"{dtype}, lengths {lengths}", flush=True)
    att = attention_rates(lengths, heads, kvh, m.head_dim, dev, dtype, args.repeats)
    for a in att:
        print(f"  L={a['seqlen']:>6}: fwd {a['fwd_tflops'] * 1e3:9.3f} GFLOP/s  bwd {a['bwd_tflops'] * 1e3:9.3f} GFLOP/s",
              flush=True)
    toks = 4096 if cuda else 1024
    shapes = [(toks, m.ffn // args.tp, m.hidden), (toks, m.hidden, m.ffn // args.tp),
              (toks, (m.heads + 2 * m.kv_heads) * m.head_dim // args.tp, m.hidden)]
    gemm = gemm_rate(shapes, dev, dtype, args.repeats)
    print(f"[calibrate] GEMM: {gemm['tflops'] * 1e3:.2f} GFLOP/s at {gemm['shape']}", flush=True)
    intra = inter = None
    if cuda:
        import torch.distributed as dist
        if int(os.environ.get("WORLD_SIZE", "1")) >= 2:
            dist.init_process_group("nccl")
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            sizes = [1 << 12, 1 << 26]
            intra = ping_pong(0, 1, sizes, "cuda") if local >= 2 else None
            if dist.get_world_size() > local:
                inter = ping_pong(0, local, sizes, "cuda")
            if dist.get_rank() != 0:
                return 0
        else:
            print("[calibrate] one process: links not measured (launch with torchrun on >= 2 GPUs)")
    else:
        intra = cpu_link()
        print(f"[calibrate] gloo: {intra['GBps']:.3f} GB/s, latency {intra['latency_us']:.1f} us", flush=True)
    base = load_profile(args.base)
    gpn = args.gpus_per_node or (torch.cuda.device_count() if cuda else 2)
    prof = build_profile(name, torch.cuda.get_device_name() if cuda else "cpu (gloo)", att, gemm, intra,
                         None if not cuda else inter, base, gpn, args.nics_per_node or gpn,
                         torch.cuda.get_device_properties(0).total_memory / 1e9 if cuda
                         else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    prof.save(out)
    with open(os.path.splitext(out)[0] + ".measurements.json", "w") as f:
        json.dump({"attention": att, "gemm": gemm, "intra": intra, "inter": inter, "model": m.name,
                   "tp": args.tp, "dtype": str(dtype)}, f, indent=2)
    print(f"[calibrate] wrote {out} (use it as --cluster {out})")
    return 0
