"""Megatron flags of one SLURM job: the same model, data and tokens per iteration in every mode.

Modes (one job each per run of a matrix):

- ``zeppelin``: scripts/pretrain_gpt_zeppelin.py with ``--zeppelin-balance``: whole documents, planned
  every global micro-batch (``--dataloader-type external``; CP is Zeppelin's, so Megatron's CP is 1);
- ``dp``: stock Megatron data parallel over packed samples of ``seq_length`` tokens;
- ``cp_p2p`` / ``cp_a2a_p2p`` / ``cp_all_gather``: stock context parallelism over a fixed group of
  ``cp`` ranks, ``--cp-comm-type p2p`` (TE's ring), ``a2a+p2p`` (hierarchical: all-to-all inside a
  node, ring across nodes, ``--hierarchical-context-parallel-sizes``) and ``all_gather`` (KV gathered).

The flags a Zeppelin run needs and the stock jobs' document masking come from spec/megatron_flags.py
(what ``zeppelin advise`` prints too). How the stock jobs attend over packed variable-length data: ``--dataloader-inter-document-masking``
makes Megatron's GPTDataset return ``cu_seqlens`` at the dataset's document boundaries, and
pretrain_gpt.py passes them as THD ``PackedSeqParams`` (TE's varlen attention, CP-aware; position
ids reset per document): no dense ``[s, s]`` mask is built (``--no-create-attention-mask-in-dataloader``).
On a CPU run (``device: cpu``) the stock model is Megatron's local spec, which has no THD path: there
the dp job builds the dense per-document mask (``--reset-attention-mask``), affordable at toy lengths.

Tokens per iteration: every job trains ``global_batch_tokens`` = ``--global-batch-size`` samples of
``--seq-length`` tokens. The Zeppelin entry reads a global micro-batch of ``seq_length x
micro_batch_size x DP`` tokens and Megatron runs ``global_batch_size / (micro_batch_size x DP)`` of
them, the same product. ``--global-batch-size`` must divide by ``DP x micro_batch_size`` of every mode
(DP = world / (TP x CP)), which :func:`check_run` enforces, naming the matrix key.

>>> run = {"name": "7b", "model": "llama-7b", "nodes": 2, "gpus_per_node": 8, "cp": 16,
...        "seq_length": 65536, "global_batch_tokens": "1M", "data_path": "/data/arxiv_text_document"}
>>> a = megatron_args(run, "cp_a2a_p2p")
>>> a[a.index("--cp-comm-type") + 1], a[a.index("--hierarchical-context-parallel-sizes") + 1:][:2]
('a2a+p2p', ['8', '2'])
>>> z = megatron_args(run, "zeppelin")
>>> "--zeppelin-balance" in z, z[z.index("--dataloader-type") + 1], z[z.index("--global-batch-size") + 1]
(True, 'external', '16')
>>> tokens_per_iteration(run)
1048576
"""

from __future__ import annotations

from typing import Dict, List

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.spec.megatron_flags import document_masking_flags, merge, zeppelin_flags
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.token_counts import parse_tokens  # one parser for every command

MODES = ("zeppelin", "dp", "cp_p2p", "cp_a2a_p2p", "cp_all_gather")
CP_COMM_TYPE = {"cp_p2p": "p2p", "cp_a2a_p2p": "a2a+p2p", "cp_all_gather": "all_gather"}
DEVICES = ("gpu", "cpu")
DEFAULTS = {"gpus_per_node": 8, "tp": 1, "cp": 8, "seq_length": 65536, "global_batch_tokens": "1M",
            "micro_batch_size": 1, "train_iters": 50, "time": "01:00:00", "cluster": "h200",
            "modes": list(MODES), "device": "gpu", "tokenizer_type": "GPT2BPETokenizer",
            "tokenizer_args": [], "seed": 1234, "extra_args": []}
# What megatron.training needs on CPU besides the plugin's CPU shim: gloo, the local spec (torch
# norms: no persistent layer norm), no fused CUDA kernels.
CPU_ARGS = ["--distributed-backend", "gloo", "--transformer-impl", "local", "--no-persist-layer-norm",
            "--no-rope-fusion", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
            "--no-bias-dropout-fusion", "--no-bias-swiglu-fusion"]


class SlurmError(ZeppelinError):
    pass


def data_words(data_path) -> List[str]:
    """``--data-path``'s words: one prefix, or a Megatron blend (``"0.3 A 0.7 B"`` or a YAML list)."""
    words = data_path.split() if isinstance(data_path, str) else [str(x) for x in (data_path or [])]
    if not words:
        raise SlurmError("data_path is empty: give a Megatron indexed dataset prefix (PREFIX.bin + PREFIX.idx)")
    return words


def _full(run: Dict) -> Dict:
    return {**DEFAULTS, **run}


def world_size(run: Dict) -> int:
    r = _full(run)
    return int(r["nodes"]) * int(r["gpus_per_node"])


def cp_of(run: Dict, mode: str) -> int:
    return int(_full(run)["cp"]) if mode in CP_COMM_TYPE else 1


def data_parallel_size(run: Dict, mode: str) -> int:
    return world_size(run) // (int(_full(run)["tp"]) * cp_of(run, mode))


def tokens_per_iteration(run: Dict) -> int:
    """Tokens every job of the run trains per iteration (global batch size x sequence length)."""
    r = _full(run)
    return global_batch_size(r) * parse_tokens(r["seq_length"])


def global_batch_size(run: Dict) -> int:
    r = _full(run)
    return max(1, parse_tokens(r["global_batch_tokens"]) // parse_tokens(r["seq_length"]))


def check_run(run: Dict) -> None:
    """The run's settings every mode needs; errors name the matrix key to change."""
    r = _full(run)
    name, seq, tp, cp = r.get("name", "?"), parse_tokens(r["seq_length"]), int(r["tp"]), int(r["cp"])
    g, mbs, world = int(r["gpus_per_node"]), int(r["micro_batch_size"]), world_size(r)
    if r["device"] not in DEVICES:
        raise SlurmError(f"run {name}: device {r['device']!r} is not one of {', '.join(DEVICES)}")
    for mode in r["modes"]:
        if mode not in MODES:
            raise SlurmError(f"run {name}: unknown mode {mode!r} (modes: {', '.join(MODES)})")
    if world % tp:
        raise SlurmError(f"run {name}: tp {tp} must divide the {world} ranks (nodes x gpus_per_node)")
    tokens = parse_tokens(r["global_batch_tokens"])
    if tokens % seq:
        raise SlurmError(f"run {name}: global_batch_tokens {tokens} is not a multiple of seq_length {seq}")
    gbs = tokens // seq
    cp_modes = [m for m in r["modes"] if m in CP_COMM_TYPE]
    if cp_modes:
        if cp < 2 or (world // tp) % cp:
            raise SlurmError(f"run {name}: cp {cp} must be >= 2 and divide the {world // tp} DPxCP ranks")
        if seq % (2 * cp):
            raise SlurmError(f"run {name}: seq_length {seq} must be a multiple of 2 x cp = {2 * cp}")
        if "cp_a2a_p2p" in cp_modes:
            _check_hierarchical(r, name, cp, g // tp, tp)
    for mode in r["modes"]:
        step = data_parallel_size(r, mode) * mbs
        if gbs % step:
            need = max(data_parallel_size(r, m) * mbs for m in r["modes"])
            raise SlurmError(f"run {name}: mode {mode} has DP {data_parallel_size(r, mode)} x micro_batch_size "
                             f"{mbs}, which must divide the global batch of {gbs} samples: set "
                             f"global_batch_tokens to a multiple of {need * seq} (= {need} x seq_length)")


def _check_hierarchical(r: Dict, name: str, cp: int, per_node: int, tp: int) -> None:
    """a2a+p2p: all-to-all over the CP ranks of a node (heads split), ring across nodes."""
    if cp <= per_node:
        raise SlurmError(f"run {name}: cp_a2a_p2p with cp {cp} inside one node ({per_node} CP ranks) is plain "
                         f"a2a, not hierarchical: set cp to a multiple of {per_node} above it, or drop the mode")
    if cp % per_node:
        raise SlurmError(f"run {name}: cp {cp} is not a multiple of the {per_node} CP ranks in a node")
    m = load_model(r["model"])
    for what, n in (("attention heads", m.heads), ("KV heads", m.kv_heads)):
        if n % tp or (n // tp) % per_node:
            raise SlurmError(f"run {name}: cp_a2a_p2p splits the {n // max(tp, 1)} {what} per TP rank over the "
                             f"{per_node} CP ranks of a node, which must divide them: change cp, tp or drop the mode")


def megatron_args(run: Dict, mode: str) -> List[str]:
    """pretrain_gpt.py flags of ``mode`` for ``run`` (after :func:`check_run`)."""
    r = _full(run)
    if mode not in MODES:
        raise SlurmError(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
    m = load_model(r["model"])
    seq, tp, cp, g = parse_tokens(r["seq_length"]), int(r["tp"]), int(r["cp"]), int(r["gpus_per_node"])
    cpu = r["device"] == "cpu"
    iters = int(r["train_iters"])
    a = ["--num-layers", m.layers, "--hidden-size", m.hidden, "--num-attention-heads", m.heads,
         "--ffn-hidden-size", m.ffn, "--seq-length", seq, "--max-position-embeddings", seq,
         "--micro-batch-size", r["micro_batch_size"], "--global-batch-size", global_batch_size(r),
         "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
         "--untie-embeddings-and-output-weights", "--disable-bias-linear",
         "--attention-dropout", 0, "--hidden-dropout", 0, "--tensor-model-parallel-size", tp,
         "--data-path", *data_words(r["data_path"]), "--split", "100,0,0",
         "--tokenizer-type", r["tokenizer_type"], *r["tokenizer_args"], "--seed", r["seed"],
         "--train-iters", iters, "--lr", "3e-4", "--min-lr", "3e-5", "--lr-decay-style", "cosine",
         "--lr-warmup-iters", min(2, iters - 1), "--log-interval", 1, "--eval-iters", 0,
         "--eval-interval", iters, "--clip-grad", "1.0", "--log-throughput"]
    a += CPU_ARGS if cpu else ["--bf16", "--use-distributed-optimizer", "--overlap-grad-reduce"]
    if m.kv_heads != m.heads:
        a += ["--group-query-attention", "--num-query-groups", m.kv_heads]
    if tp > 1 and mode != "zeppelin":  # Zeppelin's layer spec does not support sequence parallelism yet
        a += ["--sequence-parallel"]
    a += list(r["extra_args"])
    if mode == "zeppelin":  # the flags every Zeppelin run needs: spec/megatron_flags.py, as advise prints them
        return merge([str(x) for x in a], zeppelin_flags("zeppelin", r["cluster"], g, tp))
    a = merge([str(x) for x in a], document_masking_flags(cpu))
    a += ["--context-parallel-size", cp_of(r, mode)]
    if mode in CP_COMM_TYPE:
        a += ["--cp-comm-type", CP_COMM_TYPE[mode]]
        if mode == "cp_a2a_p2p":
            inner = min(cp, g // tp)
            a += ["--hierarchical-context-parallel-sizes", inner, cp // inner]
    return [str(x) for x in a]
