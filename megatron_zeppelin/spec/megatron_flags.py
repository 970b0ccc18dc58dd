"""The Megatron-LM flags a run needs beyond its model and batch, in one place: ``zeppelin advise``
(advise/megatron_line.py), the SLURM renderer (slurm/args.py) and the lines quoted in docs/ all read
them here, and tests/megatron_lm/ checks every such line with Megatron's own argument parsing and
validation plus the plugin's. Integration-free (no megatron import): only strings.

- **A Zeppelin run** (``--zeppelin-balance``, the entry spec/entries.py ``ZEPPELIN_ENTRY``) needs what the plugin's
  validation refuses to run without: ``--no-rope-fusion`` (the plan hands RoPE per-token positions,
  which Megatron's fused sbhd kernel cannot take: integration/args.py), ``--calculate-per-token-loss``
  (the loss is the domain-wide per-token mean) and ``--dataloader-type external`` (it reads whole
  documents itself: integration/megatron_lm.py), with rope positions and no attention dropout.
  ``--zeppelin-gpus-per-node`` counts the domain ranks of a node: its GPUs over TP.
- **A stock packed run** (Megatron DP or CP over samples of ``--seq-length`` tokens) attends within
  documents only with the document-masking flags: position ids reset per document, no loss on the
  EOD token, and on GPU THD inter-document masking (``cu_seqlens`` at document boundaries, no dense
  mask); on CPU Megatron's local spec has no THD path, so the dense per-document mask.
- **ZeRO with Zeppelin**: the distributed optimizer (ZeRO-1) or DDP, never Megatron-FSDP
  (ZeRO-2/3): that combination has run nowhere (Megatron-FSDP needs CUDA, and the plugin's runs
  are CPU runs), so nothing says Zeppelin's planned micro-batches and FSDP's per-micro-batch
  gathers work together.

>>> zeppelin_flags("zeppelin", "h200", gpus_per_node=8, tp=2, nics_per_node=8)[:6]
['--zeppelin-balance', '--zeppelin-cluster', 'h200', '--zeppelin-gpus-per-node', '4', '--zeppelin-nics-per-node']
>>> merge(["--no-rope-fusion", "--seq-length", "8"], ["--seq-length", "9", "--no-rope-fusion", "--bf16"])
['--no-rope-fusion', '--seq-length', '8', '--bf16']
"""

from __future__ import annotations

from typing import List, Sequence

# The data prefix a printed line leaves to the user (a Megatron indexed dataset: PREFIX.bin/.idx).
DATA_PLACEHOLDER = "PREFIX"

# Every run: the loss is a per-token mean over the batch's tokens (Zeppelin's needs it; the stock
# runs take it too, so every mode trains the same loss).
PER_TOKEN_LOSS = ["--calculate-per-token-loss"]
# What --zeppelin-balance requires of Megatron's own flags (see the module doc).
ZEPPELIN_REQUIRED = ["--position-embedding-type", "rope", "--attention-dropout", "0", "--no-rope-fusion",
                     *PER_TOKEN_LOSS, "--dataloader-type", "external"]
ZEPPELIN_ZERO_STAGES = (0, 1)
WHY_NO_FSDP_WITH_ZEPPELIN = ("Megatron-FSDP (ZeRO-2/3) with --zeppelin-balance has run nowhere (FSDP needs "
                             "CUDA; the plugin's runs are on CPU), so Zeppelin is advised with the distributed "
                             "optimizer (ZeRO-1) or DDP")


def zeppelin_flags(strategy: str = "zeppelin", cluster: str = "h200", gpus_per_node: int = 8, tp: int = 1,
                   nics_per_node: int = 0) -> List[str]:
    """The flags of a Zeppelin run: the plugin's (``strategy``: zeppelin or a baseline through the
    same engine; ``gpus_per_node`` / ``nics_per_node``: the node's GPUs and NICs, divided by TP into
    domain ranks) and what it requires of Megatron's (``ZEPPELIN_REQUIRED``)."""
    out = ["--zeppelin-balance", "--zeppelin-cluster", str(cluster),
           "--zeppelin-gpus-per-node", str(max(1, gpus_per_node // tp))]
    if nics_per_node:
        out += ["--zeppelin-nics-per-node", str(max(1, nics_per_node // tp))]
    if strategy != "zeppelin":
        out += ["--zeppelin-strategy", strategy]
    return out + ZEPPELIN_REQUIRED


def document_masking_flags(cpu: bool = False) -> List[str]:
    """A stock packed run's flags that keep attention and loss within documents (module doc)."""
    dense_or_thd = (["--reset-attention-mask"] if cpu
                    else ["--dataloader-inter-document-masking", "--no-create-attention-mask-in-dataloader"])
    return ["--reset-position-ids", "--eod-mask-loss", *dense_or_thd, *PER_TOKEN_LOSS]


def _groups(flags: Sequence[str]):
    """(flag, [flag and its values]) for each ``--flag`` of a line, in order."""
    out = []
    for f in flags:
        if str(f).startswith("--") or not out:
            out.append((str(f), [str(f)]))
        else:
            out[-1][1].append(str(f))
    return out


def merge(flags: Sequence[str], extra: Sequence[str]) -> List[str]:
    """``flags`` followed by each flag of ``extra`` (with its values) that ``flags`` lacks: a required
    flag is added once, and a value already chosen is kept."""
    have = {name for name, _ in _groups(flags)}
    out = [str(f) for f in flags]
    for name, group in _groups(extra):
        if name not in have:
            out += group
            have.add(name)
    return out
