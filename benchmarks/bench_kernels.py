"""Kernel throughput of the local queue: Zeppelin's local queue vs one packed varlen call vs one call
per document (tokens/s, forward and forward+backward), on the kernel ``auto`` picks (or ``--kernel``).

The batch is sampled from a workload preset (default github: many short documents, where launches
per document dominate). The three ways compute the same causal per-document attention:

- ``zeppelin_local_queue``: AttentionEngine on a one-rank plan with every document local (the
  engine's accumulators, LSE merge and one varlen call for all local documents);
- ``packed_varlen``: one varlen_forward / varlen_backward call on the packed batch (the floor);
- ``per_document``: one block_forward / block_backward call per document (what the engine did before).

Each way also reports how many varlen kernel calls its forward makes (1, 1 and one per document).
CPU numbers are only a smoke run (and only indicative on a shared machine); the numbers that count
come from a GPU (scripts/gpu_check.sh runs this with ``--device cuda``).

    python benchmarks/bench_kernels.py --device cuda --out $OUT/bench_kernels.json
    .venv/bin/python benchmarks/bench_kernels.py --device cpu --dtype float32 --tokens 4096 --max-len 2048 \
        --heads 4 --kv-heads 2 --head-dim 32 --repeats 3 --out benchmarks/results/bench_kernels_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megatron_zeppelin.attention.engine import AttentionEngine  # noqa: E402
from megatron_zeppelin.attention.kernels import (Kernel, Varlen, block_backward, block_forward,  # noqa: E402
                                                  varlen_backward, varlen_forward)
from megatron_zeppelin.attention.testing import hand_plan  # noqa: E402
from megatron_zeppelin.attention.kernels import select  # noqa: E402
from megatron_zeppelin.calibrate.timing import all_seconds  # noqa: E402
from megatron_zeppelin.spec.topology import Topology  # noqa: E402
from megatron_zeppelin.data.workloads import describe_batch, sample_batch  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "float32": torch.float32, "float64": torch.float64}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--kernel", default="auto", help="--zeppelin-attention-kernel value")
    p.add_argument("--transformer-impl", default="transformer_engine")
    p.add_argument("--dataset", default="github")
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--max-len", type=int, default=16384)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)

    dev, dt = a.device, DTYPES[a.dtype]
    lengths = [int(x) for x in sample_batch(a.dataset, a.tokens, a.seed, a.max_len)]
    t = sum(lengths)
    kernel = Kernel(a.kernel, a.transformer_impl)
    g = torch.Generator().manual_seed(a.seed)
    q, k, v = (torch.randn(t, h, a.head_dim, generator=g).to(dev, dt) for h in (a.heads, a.kv_heads, a.kv_heads))
    scale = a.head_dim ** -0.5
    eng = AttentionEngine(hand_plan(lengths, Topology(1, 1), [0] * len(lengths)), 0, None, backend=kernel)
    eng.scale = scale  # what eng(q, k, v) sets; forward/backward are timed without autograd
    spec = Varlen(tuple(lengths), tuple(lengths), causal=True)
    bounds = [sum(lengths[:i]) for i in range(len(lengths) + 1)]

    def queue_fwd():
        return eng.forward(q, k, v)

    out_e, lse_e, _ = queue_fwd()

    def queue_fb():
        o, l, heads = eng.forward(q, k, v)  # heads: what a2a rings saved for the backward (none here)
        eng.backward(q, k, v, o, l, q, heads)

    def packed_fwd():
        return varlen_forward(q, k, v, spec, scale, kernel)

    def packed_fb():
        o, l = varlen_forward(q, k, v, spec, scale, kernel)
        varlen_backward(q, q, k, v, o, l, spec, scale, kernel)

    def per_doc_fwd():
        return [block_forward(q[b0:b1], k[b0:b1], v[b0:b1], scale, 0, kernel) for b0, b1 in zip(bounds, bounds[1:])]

    def per_doc_fb():
        for b0, b1 in zip(bounds, bounds[1:]):
            o, l = block_forward(q[b0:b1], k[b0:b1], v[b0:b1], scale, 0, kernel)
            block_backward(q[b0:b1], q[b0:b1], k[b0:b1], v[b0:b1], o, l, scale, 0, kernel)

    res = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
           "kernel": kernel.resolve(torch.device(dev), dt), "dtype": a.dtype, "heads": a.heads,
           "kv_heads": a.kv_heads, "head_dim": a.head_dim, "dataset": a.dataset, "batch": describe_batch(
               sample_batch(a.dataset, a.tokens, a.seed, a.max_len)), "tokens": t, "documents": len(lengths),
           "ways": {}}
    for name, fwd, fb in (("zeppelin_local_queue", queue_fwd, queue_fb), ("packed_varlen", packed_fwd, packed_fb),
                          ("per_document", per_doc_fwd, per_doc_fb)):
        f = min(all_seconds(fwd, dev, a.repeats))  # the fastest repeat (calibrate/timing.py)
        b = min(all_seconds(fb, dev, a.repeats))
        res["ways"][name] = {"fwd_s": f, "fwd_bwd_s": b, "fwd_tokens_per_s": t / f, "fwd_bwd_tokens_per_s": t / b,
                             "kernel_calls_fwd": _calls(fwd)}
        print(f"{name:22s} fwd {t / f:12.0f} tok/s   fwd+bwd {t / b:12.0f} tok/s   "
              f"{res['ways'][name]['kernel_calls_fwd']} kernel calls forward", flush=True)
    o_ref = varlen_forward(q, k, v, spec, scale, kernel)[0]
    res["queue_vs_packed_max_abs_diff"] = float((out_e.to(o_ref.dtype) - o_ref).abs().max())
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(f"wrote {a.out}")


def _calls(fn) -> int:
    """Varlen kernel calls one run of ``fn`` makes (counted at the backend dispatch)."""
    n, real = [0], select.forward

    def counted(*args):
        n[0] += 1
        return real(*args)

    select.forward = counted
    try:
        fn()
    finally:
        select.forward = real
    return n[0]


if __name__ == "__main__":
    main()
