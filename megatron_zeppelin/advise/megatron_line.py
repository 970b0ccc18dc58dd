"""The Megatron-LM flag line for an advised configuration: model shape, parallelism (TP with
sequence parallelism, CP or Zeppelin), batch (micro-batch size and the fixed global batch in
sequences), the DP optimizer (DDP / distributed optimizer / Megatron-FSDP) and activation
recompute, complete as megatron-core's argument validation requires (e.g. ``--recompute-granularity
full`` with ``--recompute-method`` and ``--recompute-num-layers``). Data, tokenizer and learning-rate
flags are the user's (``DATA_FLAGS``: a placeholder set that runs on mock data).

>>> from megatron_zeppelin.spec.model import ModelSpec
>>> from megatron_zeppelin.spec.memory import MemoryPrediction
>>> from megatron_zeppelin.spec.recompute import Recompute
>>> from megatron_zeppelin.advise.recommend import Candidate
>>> m = ModelSpec(name="m", layers=4, hidden=256, heads=8, kv_heads=4, ffn=512, vocab=1000)
>>> c = Candidate(tp=2, cp=1, strategy="packed_dp", zero_stage=1, recompute=Recompute("full"), mbs=1, ga=2, dp=4,
...               iteration_s=1.0, tokens_per_s=1.0, capacity_tokens=1, memory=MemoryPrediction(0, 0, 0, 0), fits=True)
>>> line = megatron_flags(c, m, seq_length=4096, global_batch_tokens=4096 * 8)
>>> " ".join(line[line.index("--tensor-model-parallel-size"):][:3])
'--tensor-model-parallel-size 2 --sequence-parallel'
>>> check_consistency(line, c, m, world=8, seq_length=4096, global_batch_tokens=4096 * 8)
[]
"""

from __future__ import annotations

import shlex
from typing import List

from megatron_zeppelin.spec.entries import PACKED_ENTRY, ZEPPELIN_ENTRY, launch_args
from megatron_zeppelin.spec.model import ModelSpec

DATA_FLAGS = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--lr", "3e-4", "--min-lr", "3e-5",
              "--lr-decay-style", "cosine", "--train-iters", "1000", "--eval-iters", "0", "--eval-interval", "1000"]


def model_flags(m: ModelSpec, seq_length: int) -> List[str]:
    out = ["--num-layers", str(m.layers), "--hidden-size", str(m.hidden), "--num-attention-heads", str(m.heads),
           "--ffn-hidden-size", str(m.ffn), "--kv-channels", str(m.head_dim)]
    if m.kv_heads != m.heads:
        out += ["--group-query-attention", "--num-query-groups", str(m.kv_heads)]
    return out + ["--seq-length", str(seq_length), "--max-position-embeddings", str(seq_length),
                  "--vocab-size", str(m.vocab), "--normalization", "RMSNorm", "--swiglu",
                  "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights",
                  "--disable-bias-linear", "--attention-dropout", "0", "--hidden-dropout", "0", "--bf16"]


def megatron_flags(c, m: ModelSpec, seq_length: int, global_batch_tokens: int, cluster: str = "h200",
                   gpus_per_node: int = 8, nics_per_node: int = 0) -> List[str]:
    out = model_flags(m, seq_length)
    out += ["--micro-batch-size", str(c.mbs), "--global-batch-size", str(global_batch_tokens // seq_length)]
    out += ["--tensor-model-parallel-size", str(c.tp)]
    if c.sp:
        out.append("--sequence-parallel")
    out += ["--pipeline-model-parallel-size", "1", "--context-parallel-size", str(c.cp)]
    if c.cp > 1:
        out += ["--cp-comm-type", "p2p"]
    if c.zero_stage == 0:
        out += ["--overlap-grad-reduce"]
    elif c.zero_stage == 1:
        out += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    else:
        out += ["--use-megatron-fsdp", "--use-distributed-optimizer", "--data-parallel-sharding-strategy",
                "optim_grads" if c.zero_stage == 2 else "optim_grads_params", "--overlap-grad-reduce",
                "--overlap-param-gather", "--ckpt-format", "fsdp_dtensor"]
    out += c.recompute.megatron_flags()
    if c.strategy in ("zeppelin", "hybrid_dp"):
        out += ["--zeppelin-balance", "--zeppelin-strategy", c.strategy, "--zeppelin-cluster", cluster,
                "--zeppelin-gpus-per-node", str(gpus_per_node // c.tp), "--dataloader-type", "external"]
        if nics_per_node:
            out += ["--zeppelin-nics-per-node", str(max(1, nics_per_node // c.tp))]
    return out


def launch_env(c) -> dict:
    """Environment the line needs: Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 for TP or CP on
    GPUs before Blackwell, and Megatron-FSDP asserts it is NOT 1."""
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if (c.tp > 1 or c.cp > 1) and c.zero_stage < 2 else {}


def launcher(c, nodes: int, gpus_per_node: int) -> str:
    """torchrun of an entry module the package ships (a wheel install has it): the Zeppelin entry, or
    for stock Megatron the packed entry (pretrain_gpt.py's GPT path on megatron.training)."""
    entry = ZEPPELIN_ENTRY if c.strategy in ("zeppelin", "hybrid_dp") else PACKED_ENTRY
    env = "".join(f"{k}={v} " for k, v in launch_env(c).items())
    return f"{env}torchrun --nnodes {nodes} --nproc-per-node {gpus_per_node} {' '.join(launch_args(entry))}"


def command_line(c, m: ModelSpec, nodes: int, gpus_per_node: int, seq_length: int, global_batch_tokens: int,
                 cluster: str, nics_per_node: int = 0) -> str:
    flags = megatron_flags(c, m, seq_length, global_batch_tokens, cluster, gpus_per_node, nics_per_node)
    return launcher(c, nodes, gpus_per_node) + " " + " ".join(shlex.quote(f) for f in flags + DATA_FLAGS)


def _value(flags: List[str], name: str):
    return flags[flags.index(name) + 1] if name in flags else None


def check_consistency(flags: List[str], c, m: ModelSpec, world: int, seq_length: int,
                      global_batch_tokens: int) -> List[str]:
    """Problems with a flag line, without Megatron: the rules megatron-core's validation enforces
    that advise's choices touch, and agreement with the candidate. [] when consistent."""
    bad = []
    tp, cp = int(_value(flags, "--tensor-model-parallel-size")), int(_value(flags, "--context-parallel-size"))
    mbs, gbs = int(_value(flags, "--micro-batch-size")), int(_value(flags, "--global-batch-size"))
    if world % (tp * cp):
        bad.append(f"TP x CP = {tp * cp} does not divide {world} GPUs")
    dp = world // (tp * cp)
    if gbs % (mbs * dp):
        bad.append(f"--global-batch-size {gbs} is not a multiple of micro-batch {mbs} x DP {dp}")
    if gbs * seq_length != global_batch_tokens:
        bad.append(f"global batch {gbs} x {seq_length} != {global_batch_tokens} tokens (a hyperparameter)")
    if (tp, cp, mbs, dp, gbs // (mbs * dp)) != (c.tp, c.cp, c.mbs, c.dp, c.ga):
        bad.append("TP/CP/micro-batch/DP/accumulation differ from the advised candidate")
    if m.heads % tp or m.kv_heads % tp:
        bad.append(f"TP {tp} does not divide the heads")
    gran = _value(flags, "--recompute-granularity")
    if gran == "full" and not ("--recompute-method" in flags and "--recompute-num-layers" in flags):
        bad.append("--recompute-granularity full needs --recompute-method and --recompute-num-layers")
    if gran == "selective" and ("--recompute-method" in flags or "--recompute-num-layers" in flags):
        bad.append("selective recompute takes no --recompute-method / --recompute-num-layers")
    if (gran or "none") != c.recompute.granularity:
        bad.append(f"recompute {gran} != advised {c.recompute.granularity}")
    if "--sequence-parallel" in flags and tp == 1:
        bad.append("--sequence-parallel needs TP > 1")
    if "--zeppelin-balance" in flags and cp != 1:
        bad.append("--zeppelin-balance plans CP itself: --context-parallel-size must be 1")
    if "--overlap-param-gather" in flags and "--use-distributed-optimizer" not in flags:
        bad.append("--overlap-param-gather needs --use-distributed-optimizer")
    stage = (0 if "--use-distributed-optimizer" not in flags else
             1 if "--use-megatron-fsdp" not in flags else
             2 if _value(flags, "--data-parallel-sharding-strategy") == "optim_grads" else 3)
    if stage != c.zero_stage:
        bad.append(f"flags give ZeRO-{stage}, advised ZeRO-{c.zero_stage}")
    if len(flags) != len(set(f for f in flags if f.startswith("--"))) + sum(1 for f in flags if not f.startswith("--")):
        bad.append("a flag appears twice")
    return bad
