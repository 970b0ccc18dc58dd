"""Hooks for Megatron-LM's own ``pretrain(...)`` (pretrain_gpt.py): flags, layer spec, data, step.

Used by ``scripts/pretrain_gpt_zeppelin.py`` and by ``patches/megatron-lm-zeppelin.patch``:

- ``extra_args_provider(parser)``: the ``--zeppelin-*`` flags (chains another provider if given).
- ``--spec megatron_zeppelin.integration.megatron_lm zeppelin_layer_spec``: the Zeppelin layer spec
  (a module attribute, built on first access, as Megatron-LM's ``import_module`` expects).
- ``train_valid_test_datasets_provider``: whole documents of ``--data-path`` (one prefix) as
  global micro-batches of ``seq_length x micro_batch_size x DP`` trained tokens, documents cut at
  ``--seq-length``; use with ``--dataloader-type external``.
- ``forward_step(data_iterator, model)``: plan the batch (every rank, same plan), build this rank's
  tensors, run the model; the loss function returns Megatron's per-token triple (sum, tokens,
  report), so ``--calculate-per-token-loss`` divides by the domain's token count.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Optional

import torch

from ..errors import ZeppelinError
from .args import add_zeppelin_args, config_from_args


def extra_args_provider(parser, chain: Optional[Callable] = None):
    parser = add_zeppelin_args(parser)
    return chain(parser) if chain is not None else parser


def __getattr__(name):  # PEP 562: build the spec only when Megatron-LM asks for it
    if name == "zeppelin_layer_spec":
        from .spec import get_gpt_layer_zeppelin_spec
        return get_gpt_layer_zeppelin_spec()
    raise AttributeError(name)


def validate(args) -> None:
    """Megatron-LM settings --zeppelin-balance needs; errors name the flag."""
    config_from_args(args)
    if not getattr(args, "calculate_per_token_loss", False):
        raise ZeppelinError("--zeppelin-balance needs --calculate-per-token-loss (loss = domain-wide per-token mean)")
    if getattr(args, "dataloader_type", None) != "external":
        raise ZeppelinError("--zeppelin-balance reads whole documents itself: set --dataloader-type external")
    if getattr(args, "position_embedding_type", "rope") != "rope":
        raise ZeppelinError("--zeppelin-balance supports --position-embedding-type rope")
    if not args.data_path or len(args.data_path) != 1:
        raise ZeppelinError("--zeppelin-balance needs exactly one --data-path PREFIX (blends are not supported yet)")


class DocumentBatches:
    """Iterator of global micro-batches (lists of L+1-token documents), resumable by step."""

    def __init__(self, prefix: str, tokens_per_batch: int, max_doc_tokens: int, seed: int, start_step: int = 0):
        from .data import BatchSampler, DocumentDataset
        self.ds = DocumentDataset(prefix)
        self.sampler = BatchSampler(self.ds.lengths, tokens_per_batch, max_doc_tokens, seed=seed)
        self.step = start_step

    def __iter__(self):
        return self

    def __next__(self):
        from .data import batch_documents
        docs = batch_documents(self.ds, self.sampler, self.step)
        self.step += 1
        return docs


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    from megatron.core import parallel_state as ps
    from megatron.training import get_args

    args = get_args()
    validate(args)
    tokens = args.seq_length * args.micro_batch_size * ps.get_data_parallel_world_size()
    start = getattr(args, "iteration", 0) or 0  # resume: the order depends on (seed, step) only
    train = DocumentBatches(args.data_path[0], tokens, args.seq_length, args.seed, start_step=start)
    return train, None, None


def _loss_func(label_tokens: int, output_tensor: torch.Tensor):
    # per-token losses [1, t_lin] (pad rows beyond label_tokens carry none)
    loss = output_tensor[:, :label_tokens].float().sum()
    num = torch.tensor(label_tokens, dtype=torch.int, device=loss.device)
    report = torch.stack([loss.detach().clone(), num.float()])
    return loss, num, {"lm loss": report}


def forward_step(data_iterator, model, return_schedule_plan: bool = False):
    from megatron.core import parallel_state as ps
    from megatron.training import get_args

    from ..attention.kernels import Kernel
    from ..model_spec import ModelSpec
    from ..planner import plan_batch
    from ..profile import load_profile
    from ..topology import Topology
    from .batch import build_rank_batch, default_engine_factory
    from .plan_check import check_plan_agreement

    args = get_args()
    cfg = config_from_args(args)
    docs = next(data_iterator)
    group = ps.get_data_parallel_group()
    topo = Topology.from_world(ps.get_data_parallel_world_size(), cfg.gpus_per_node, cfg.nics_per_node,
                               cfg.gpu_nic_map)
    spec = ModelSpec(name="megatron", layers=args.num_layers, hidden=args.hidden_size,
                     heads=args.num_attention_heads, kv_heads=args.num_query_groups or args.num_attention_heads,
                     ffn=args.ffn_hidden_size, vocab=args.padded_vocab_size,
                     head_dim=args.kv_channels or args.hidden_size // args.num_attention_heads)
    plan = plan_batch([d.numel() - 1 for d in docs], topo, load_profile(cfg.cluster), spec, cfg)
    if cfg.debug_plan or not getattr(forward_step, "_checked", False):
        check_plan_agreement(plan, group)
        forward_step._checked = True
    kernel = Kernel(getattr(args, "zeppelin_attention_kernel", "auto"), getattr(args, "transformer_impl", None))
    batch = build_rank_batch(docs, plan, ps.get_data_parallel_rank(), group,
                             softmax_scale=spec.head_dim ** -0.5, device=torch.cuda.current_device(),
                             engine_factory=partial(default_engine_factory, kernel=kernel))
    out = model(batch.tokens, batch.position_ids, None, labels=batch.labels,
                packed_seq_params=batch.packed_seq_params)
    return out, partial(_loss_func, batch.label_tokens)
