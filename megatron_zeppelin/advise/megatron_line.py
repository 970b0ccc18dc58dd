"""The Megatron-LM flag line for an advised configuration: model shape, parallelism (TP with
sequence parallelism, CP or Zeppelin), batch (micro-batch size and the fixed global batch in
sequences of --seq-length: the context for stock Megatron, each rank's share through the Zeppelin
entry, with --max-position-embeddings the longest document), the DP optimizer (DDP / distributed
optimizer / Megatron-FSDP) and activation recompute, complete as megatron-core's argument validation
requires (e.g. ``--recompute-granularity full`` with ``--recompute-method`` and
``--recompute-num-layers``). What a Zeppelin run needs and a stock packed run's document masking come
from spec/megatron_flags.py (the SLURM jobs read the same). Data, tokenizer and learning-rate flags are
the user's (``DATA_FLAGS``: a placeholder group whose ``PREFIX`` is the user's indexed dataset).

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
>>> import dataclasses
>>> z = dataclasses.replace(c, strategy="zeppelin", share=1024, ga=8)   # a share of 1K, 8 steps
>>> line = megatron_flags(z, m, seq_length=4096, global_batch_tokens=4096 * 8)
>>> [line[line.index(f) + 1] for f in ("--seq-length", "--max-position-embeddings", "--global-batch-size")]
['1024', '4096', '32']
>>> check_consistency(line, z, m, world=8, seq_length=4096, global_batch_tokens=4096 * 8)
[]
"""

from __future__ import annotations

import shlex
from typing import List

from megatron_zeppelin.spec.entries import PACKED_ENTRY, ZEPPELIN_ENTRY, launch_args
from megatron_zeppelin.spec.megatron_flags import (DATA_PLACEHOLDER, ZEPPELIN_REQUIRED, ZEPPELIN_ZERO_STAGES,
                                                   document_masking_flags, merge, zeppelin_flags)
from megatron_zeppelin.spec.model import ModelSpec

DATA_FLAGS = ["--data-path", DATA_PLACEHOLDER, "--split", "100,0,0", "--tokenizer-type", "NullTokenizer",
              "--lr", "3e-4", "--min-lr", "3e-5", "--lr-decay-style", "cosine", "--train-iters", "1000",
              "--eval-iters", "0", "--eval-interval", "1000"]


def model_flags(m: ModelSpec, seq_length: int, max_position: int = 0) -> List[str]:
    out = ["--num-layers", str(m.layers), "--hidden-size", str(m.hidden), "--num-attention-heads", str(m.heads),
           "--ffn-hidden-size", str(m.ffn), "--kv-channels", str(m.head_dim)]
    if m.kv_heads != m.heads:
        out += ["--group-query-attention", "--num-query-groups", str(m.kv_heads)]
    return out + ["--seq-length", str(seq_length), "--max-position-embeddings", str(max_position or seq_length),
                  "--vocab-size", str(m.vocab), "--normalization", "RMSNorm", "--swiglu",
                  "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights",
                  "--disable-bias-linear", "--attention-dropout", "0", "--hidden-dropout", "0", "--bf16"]


def line_seq_length(c, seq_length: int) -> int:
    """The line's --seq-length: the candidate's per-rank share (Zeppelin entry), else the context."""
    return c.share or seq_length


def megatron_flags(c, m: ModelSpec, seq_length: int, global_batch_tokens: int, cluster: str = "h200",
                   gpus_per_node: int = 8, nics_per_node: int = 0) -> List[str]:
    """The line's flags; ``seq_length`` is the context (the longest document)."""
    seq = line_seq_length(c, seq_length)
    out = model_flags(m, seq, seq_length)
    out += ["--micro-batch-size", str(c.mbs), "--global-batch-size", str(global_batch_tokens // seq)]
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
    if c.zeppelin_entry:
        return merge(out, zeppelin_flags(c.strategy, cluster, gpus_per_node, c.tp, nics_per_node))
    return merge(out, document_masking_flags(cpu=False))


def launch_env(c) -> dict:
    """Environment the line needs: Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 for TP or CP on
    GPUs before Blackwell, and Megatron-FSDP asserts it is NOT 1."""
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if (c.tp > 1 or c.cp > 1) and c.zero_stage < 2 else {}


def launcher(c, nodes: int, gpus_per_node: int) -> str:
    """torchrun of an entry module the package ships (a wheel install has it): the Zeppelin entry for
    everything run through it (Zeppelin, and packed DP below the context), else the packed entry
    (pretrain_gpt.py's GPT path on megatron.training)."""
    entry = ZEPPELIN_ENTRY if c.zeppelin_entry else PACKED_ENTRY
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
    that advise's choices touch, what spec/megatron_flags.py says each kind of run needs, and
    agreement with the candidate. ``seq_length``: the context. [] when consistent."""
    bad = []
    tp, cp = int(_value(flags, "--tensor-model-parallel-size")), int(_value(flags, "--context-parallel-size"))
    mbs, gbs = int(_value(flags, "--micro-batch-size")), int(_value(flags, "--global-batch-size"))
    seq, max_pos = int(_value(flags, "--seq-length")), int(_value(flags, "--max-position-embeddings"))
    if world % (tp * cp):
        bad.append(f"TP x CP = {tp * cp} does not divide {world} GPUs")
    dp = world // (tp * cp)
    if gbs % (mbs * dp):
        bad.append(f"--global-batch-size {gbs} is not a multiple of micro-batch {mbs} x DP {dp}")
    if gbs * seq != global_batch_tokens:
        bad.append(f"global batch {gbs} x {seq} != {global_batch_tokens} tokens (a hyperparameter)")
    if max_pos != seq_length or seq > max_pos:
        bad.append(f"--max-position-embeddings {max_pos} is not the context {seq_length} (>= --seq-length {seq})")
    if seq != line_seq_length(c, seq_length):
        bad.append(f"--seq-length {seq} is not the advised {line_seq_length(c, seq_length)}")
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
    zeppelin = "--zeppelin-balance" in flags
    if zeppelin != c.zeppelin_entry:
        bad.append("--zeppelin-balance present/absent against the advised entry")
    if zeppelin and cp != 1:
        bad.append("--zeppelin-balance plans CP itself: --context-parallel-size must be 1")
    need = ZEPPELIN_REQUIRED if zeppelin else document_masking_flags(cpu=False)
    lacking = [f for f in need if f.startswith("--") and f not in flags]
    if lacking:
        bad.append(f"{'a Zeppelin' if zeppelin else 'a stock packed'} run lacks {' '.join(lacking)}")
    if seq != seq_length and not zeppelin:
        bad.append("a per-rank share below the context needs the Zeppelin entry (stock Megatron cuts documents)")
    if "--overlap-param-gather" in flags and "--use-distributed-optimizer" not in flags:
        bad.append("--overlap-param-gather needs --use-distributed-optimizer")
    stage = (0 if "--use-distributed-optimizer" not in flags else
             1 if "--use-megatron-fsdp" not in flags else
             2 if _value(flags, "--data-parallel-sharding-strategy") == "optim_grads" else 3)
    if stage != c.zero_stage:
        bad.append(f"flags give ZeRO-{stage}, advised ZeRO-{c.zero_stage}")
    if zeppelin and stage not in ZEPPELIN_ZERO_STAGES:
        bad.append("Megatron-FSDP with --zeppelin-balance (never run): use the distributed optimizer")
    if len(flags) != len(set(f for f in flags if f.startswith("--"))) + sum(1 for f in flags if not f.startswith("--")):
        bad.append("a flag appears twice")
    return bad
