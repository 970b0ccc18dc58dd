"""Hooks for Megatron-LM's own ``pretrain(...)`` (pretrain_gpt.py): flags, layer spec, data, step.

Used by the entry ``megatron_zeppelin.integration.pretrain_gpt`` and by ``patches/megatron-lm-zeppelin.patch``:

- ``extra_args_provider(parser)``: the ``--zeppelin-*`` flags (chains another provider if given).
- ``--spec megatron_zeppelin.integration.megatron_lm zeppelin_layer_spec``: ``zeppelin_layer_spec``
  is a module-level function (Megatron's ``import_module`` reads ``vars(module)[name]``); Megatron's
  GPT builder calls it with the run's model config, so the spec follows ``--transformer-impl``,
  ``--qk-layernorm``, ``--normalization`` (spec.py), and importing this module builds nothing.
- ``train_valid_test_datasets_provider``: whole documents of ``--data-path`` (one prefix, or
  Megatron's blends: ``--data-path 0.3 A 0.7 B``, ``--data-args-path``, per-split
  ``--train-data-path`` ...; built with megatron-core's BlendedMegatronDatasetBuilder, blend.py),
  split by ``--split`` into train / validation documents, as global micro-batches of
  ``seq_length x micro_batch_size x DP`` trained tokens (``--seq-length`` is each rank's share),
  documents cut at ``--max-position-embeddings`` (so one document may span ranks: the planner
  splits it over a ring); use with ``--dataloader-type external``. Resuming continues where the saved run stopped (the
  order depends on (seed, step) only; a step is one global micro-batch).
- ``forward_step(data_iterator, model)``: plan the batch (planned while the previous batch trained,
  plan_ahead.py, unless --no-zeppelin-plan-ahead; by the domain's rank 0, which broadcasts the Plan,
  plan_share.py, unless --zeppelin-plan-sharing every-rank: then every rank, same plan), build this rank's
  tensors, run the model; the loss function returns Megatron's per-token triple (sum, tokens,
  report) after Megatron's NaN / Inf / spiky-loss checks, so ``--calculate-per-token-loss``
  divides by the domain's token count.
- ``--pipeline-model-parallel-size`` > 1 (1F1B): every stage reads the same documents and plans each
  micro-batch itself; ``validate`` turns on Megatron's ``variable_seq_lengths`` shape exchange, and
  plan digests are compared across the stages without blocking the schedule (plan_check.py). With
  virtual pipeline stages (interleaved 1F1B) every model chunk has its own iterators of the same
  documents; a rank's first chunk takes each micro-batch's Plan and its later chunks reuse it
  (chunk_plans.py).
- ``--zeppelin-accumulation joint`` / ``by_length`` / ``rounds``: the iterators read an iteration's k global
  micro-batches (the documents data_order would train in it) and regroup them by the planner's
  assignment (planner/accumulation.py), each planned with the capacity of a data-order micro-batch; every
  rank and stage regroups alike (a pure function of the lengths).
- ``--zeppelin-stock-spec`` (no ``--zeppelin-balance``): Megatron's stock layer spec trained on the
  same document batches, each document its own causal sample (stock_batch.py): the reference the
  Zeppelin runs are checked against.
- ``shutdown()``: after ``pretrain(...)`` returns, join the plan-ahead worker and destroy the
  process groups while Python is whole.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Optional

import torch

from megatron_zeppelin.errors import ZeppelinError
from megatron_zeppelin.integration.args import add_zeppelin_args, config_from_args

SPEC = ["megatron_zeppelin.integration.megatron_lm", "zeppelin_layer_spec"]
SPIKY_LOSS_FACTOR = 10  # pretrain_gpt.py's


def extra_args_provider(parser, chain: Optional[Callable] = None):
    parser = add_zeppelin_args(parser)
    parser.add_argument("--zeppelin-stock-spec", action="store_true",
                        help="Without --zeppelin-balance: train Megatron's stock layer spec on the same "
                             "whole-document batches (one document per causal sample), the reference run.")
    return chain(parser) if chain is not None else parser


def zeppelin_layer_spec(config, vp_stage: Optional[int] = None):
    """The Zeppelin layer spec for this run's model config (Megatron's builder calls it)."""
    from megatron_zeppelin.integration.spec import zeppelin_spec_for_config

    return zeppelin_spec_for_config(getattr(config, "transformer", config))


def use_prebuilt_dataset_helpers() -> None:
    """pip's megatron-core ships its dataset helpers compiled (``helpers_cpp``) and no Makefile, but
    Megatron-LM's ``initialize`` still runs ``make`` in that folder: skip the build when the
    compiled module imports (a checkout keeps its Makefile and is left alone)."""
    import os

    from megatron.core.datasets import utils

    if os.path.exists(os.path.join(os.path.dirname(utils.__file__), "Makefile")):
        return
    try:
        from megatron.core.datasets import helpers_cpp  # noqa: F401
    except ImportError:
        return
    utils.compile_helpers = lambda: None


def shutdown() -> None:
    """Destroy every process group after ``pretrain(...)`` has returned (Megatron's pretrain leaves
    them alive). Left to interpreter exit, gloo's worker threads can still hold work whose tensors
    need the GIL while Python is being torn down, and the process aborts after a finished run
    (SIGABRT, "terminate called without an active exception": seen in CI on rank 0)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    try:
        from megatron.training import get_args
        args = get_args()
    except (ImportError, AssertionError):  # megatron-core alone, or Megatron's args never parsed
        args = None
    ahead = getattr(args, "_zeppelin_plan_ahead", None)
    if ahead is not None:
        ahead.close()
    stages = getattr(args, "_zeppelin_stage_check", None)
    if stages is not None:  # the last phase's comparisons: every stage has run all of its forwards
        stages.wait()
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def uses_documents(args) -> bool:
    return bool(getattr(args, "zeppelin_balance", False) or getattr(args, "zeppelin_stock_spec", False))


def validate(args) -> None:
    """Megatron-LM settings the document path needs; errors name the flag. Sets ``--spec``."""
    balance = bool(getattr(args, "zeppelin_balance", False))
    if balance and getattr(args, "zeppelin_stock_spec", False):
        raise ZeppelinError("--zeppelin-stock-spec is the stock reference run: drop --zeppelin-balance or it")
    if balance:
        config_from_args(args)
    if not getattr(args, "calculate_per_token_loss", False):
        raise ZeppelinError("--zeppelin-balance needs --calculate-per-token-loss (loss = domain-wide per-token mean)")
    if getattr(args, "dataloader_type", None) != "external":
        raise ZeppelinError("--zeppelin-balance reads whole documents itself: set --dataloader-type external")
    if getattr(args, "position_embedding_type", "rope") != "rope":
        raise ZeppelinError("--zeppelin-balance needs --position-embedding-type rope (Megatron's default is learned_absolute)")
    if getattr(args, "mock_data", False):
        raise ZeppelinError("--zeppelin-balance trains whole documents of indexed datasets: drop --mock-data and "
                            "give --data-path PREFIX (or a blend)")
    for flag in ("multiple_validation_sets", "full_validation", "dataloader_fast_cache_load"):
        if getattr(args, flag, False):
            raise ZeppelinError(f"--zeppelin-balance does not support --{flag.replace('_', '-')} yet: drop it")
    if getattr(args, "heterogeneous_layers_config_path", None):
        raise ZeppelinError("--zeppelin-balance supports dense GPT layers only: drop --heterogeneous-layers-config-path")
    if getattr(args, "rampup_batch_size", None):
        raise ZeppelinError("--zeppelin-balance needs a fixed batch size: drop --rampup-batch-size")
    if balance:
        backend = str(getattr(args, "attention_backend", "auto"))
        if backend.endswith("local"):  # Megatron's builder would swap the core attention back to its own
            raise ZeppelinError("--zeppelin-balance brings its own core attention: drop --attention-backend local")
        if args.spec is not None and list(args.spec) != SPEC:
            raise ZeppelinError(f"--zeppelin-balance uses its own layer spec: drop --spec {' '.join(args.spec)}")
        args.spec = list(SPEC)
    _check_splits(args)  # refuses missing documents now, not at the first evaluation
    if int(getattr(args, "pipeline_model_parallel_size", 1) or 1) > 1:
        # A rank's activations change shape with each micro-batch (its layout size under Zeppelin,
        # its document count under the stock spec): Megatron's p2p then sends each tensor's shape
        # first. Megatron's validate_args resets the flag, so it is set here, before the model
        # config is built from args.
        args.variable_seq_lengths = True
        if getattr(args, "moe_token_dispatcher_type", None) == "allgather":  # its default, refused with it
            if getattr(args, "num_experts", None):
                raise ZeppelinError("pipeline parallelism sends variable activation shapes, which Megatron's "
                                    "allgather MoE dispatcher refuses: set --moe-token-dispatcher-type alltoall")
            args.moe_token_dispatcher_type = "alltoall"  # a dense model has no dispatcher to run


def _check_splits(args) -> None:
    """Data before training: the training split has documents, every dataset of a blend has
    documents in each split ``--split`` gives it, and ``--eval-iters`` has validation documents."""
    from megatron_zeppelin.integration.blend import blend_from_args, split_documents

    if blend_from_args(args) == (None, None):
        raise ZeppelinError("--zeppelin-balance reads whole documents: give --data-path PREFIX, or a blend "
                            "(--data-path 0.3 A 0.7 B, --data-args-path FILE, --train-data-path ... / --valid-data-path ...)")
    splits = split_documents(args)
    where = f"--split {args.split}" if getattr(args, "split", None) else "the per-split data paths"
    if not splits[0] or not any(n for _, n in splits[0]):
        raise ZeppelinError(f"{where} leaves no training document of 2 or more tokens (fix --split or the data)")
    for name, parts in zip(("training", "validation", "test"), splits):
        empty = [p for p, n in parts if n == 0]
        if len(parts) > 1 and empty:
            raise ZeppelinError(f"{where} leaves no {name} document in {empty[0]}, one dataset of the blend "
                                "(change --split, or give per-split paths)")
    if getattr(args, "eval_iters", 0) and getattr(args, "eval_interval", None) is not None and \
            getattr(args, "do_valid", True) and not any(n for _, n in splits[1]):
        raise ZeppelinError(f"--eval-iters {args.eval_iters} needs validation documents: {where} leaves none "
                            "(give e.g. --split 90,10,0 or --valid-data-path, or set --eval-iters 0)")


class DocumentBatches:
    """Iterator of global micro-batches (lists of L+1-token documents) of a split's documents (a
    blend.DocumentStream, in the order Megatron's datasets yield them), from ``start_step``."""

    def __init__(self, stream, tokens_per_batch: int, max_doc_tokens: int, start_step: int = 0):
        from megatron_zeppelin.integration.data import StreamSampler
        self.ds = stream
        self.sampler = StreamSampler(stream, tokens_per_batch, max_doc_tokens)
        self.step = start_step

    def __iter__(self):
        return self

    def __next__(self):
        from megatron_zeppelin.integration.data import batch_documents
        docs = batch_documents(self.ds, self.sampler, self.step)
        self.step += 1
        return docs


def max_doc_tokens(args) -> int:
    """Longest trained document: the model's position range (at least one rank's share)."""
    return max(int(getattr(args, "max_position_embeddings", 0) or 0), int(args.seq_length))


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    from megatron.core import parallel_state as ps
    from megatron.training import get_args

    from megatron_zeppelin.integration.blend import build_document_splits

    args = get_args()
    samples_per_step = args.micro_batch_size * ps.get_data_parallel_world_size()  # one global micro-batch
    tokens = args.seq_length * samples_per_step
    streams = build_document_splits(args, train_val_test_num_samples, samples_per_step, tokens, max_doc_tokens(args))
    # With virtual pipeline stages Megatron calls this once per model chunk (vp_stage 0, 1, ...),
    # each chunk reading the same documents from iterators of its own; the run's planning worker
    # and checks are made once, with the first chunk's, which alone plans (chunk_plans.py).
    first = not vp_stage
    if first and (not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0):
        for name, st in zip(("train", "valid"), streams):
            if st is not None:
                print(f"zeppelin data: {name}: {st.describe()}", flush=True)
    # Resume: each iteration consumed num_microbatches global micro-batches (= global batch samples).
    start = int(getattr(args, "consumed_train_samples", 0) or 0) // samples_per_step
    train = DocumentBatches(streams[0], tokens, max_doc_tokens(args), start)
    valid = None
    if streams[1] is not None:
        vstart = int(getattr(args, "consumed_valid_samples", 0) or 0) // samples_per_step
        valid = DocumentBatches(streams[1], tokens, max_doc_tokens(args), vstart)
    if getattr(args, "zeppelin_balance", False):
        _stage_check(args)
        cfg, topo, spec = _domain(args)
        if _joint_applies(cfg, args):  # an iteration's documents to its micro-batches jointly
            planner = _run_planner(args, topo, spec, cfg)
            stages = int(getattr(args, "pipeline_model_parallel_size", 1) or 1)  # rounds' fill (round_fill)
            train = _joint(train, planner, _micro_batches(args, False), say=first, stages=stages)
            valid = valid if valid is None else _joint(valid, planner, _micro_batches(args, True), say=first,
                                                       stages=stages)
        share = _share_group(args, cfg)
        if first and (cfg.plan_ahead or share is not None):
            ahead = args._zeppelin_plan_ahead = _plan_ahead(args, _run_planner(args, topo, spec, cfg), share)
        if first and cfg.plan_ahead:  # each batch planned while the one before it trains (plan_ahead.py)
            from megatron_zeppelin.integration.plan_ahead import PlannedBatches
            train = PlannedBatches(train, ahead, _doc_lengths)
            valid = valid if valid is None else PlannedBatches(valid, ahead, _doc_lengths)
    return train, valid, None


def _share_group(args, cfg):
    """With --zeppelin-plan-sharing one-per-domain, this rank's domain (its DP group) as a gloo
    group of its own (plan_share.py), made once, here, where every rank arrives together, and kept
    on args; None with every-rank, or where a domain has one rank. Its timeout covers a batch's
    planning and the worker's start-up besides Megatron's own: a receiving rank waits in the
    broadcast while the planning rank plans."""
    from datetime import timedelta

    from megatron.core import parallel_state as ps

    from megatron_zeppelin.integration import plan_process
    from megatron_zeppelin.integration.plan_share import share_group
    from megatron_zeppelin.spec.config import PlanSharing

    if cfg.plan_sharing is not PlanSharing.ONE_PER_DOMAIN:
        return None
    if getattr(args, "_zeppelin_share_group", None) is None:
        timeout = timedelta(minutes=args.distributed_timeout_minutes,
                            seconds=plan_process.PLAN_TIMEOUT_S + plan_process.START_TIMEOUT_S)
        ranks = torch.distributed.get_process_group_ranks(ps.get_data_parallel_group())
        args._zeppelin_share_group = share_group(ranks, timeout)
    return args._zeppelin_share_group


def _plan_ahead(args, planner, share):
    """The run's planning worker: every rank's own (plan_ahead.PlanAhead), or its domain's
    planning rank's, shared (plan_share.SharedPlanAhead)."""
    worker = getattr(args, "zeppelin_plan_ahead_worker", "process")
    if share is None:
        from megatron_zeppelin.integration.plan_ahead import PlanAhead
        return PlanAhead(planner, worker=worker)
    from megatron_zeppelin.integration.plan_share import SharedPlanAhead
    return SharedPlanAhead(planner, share, worker=worker)


def _micro_batches(args, evaluation: bool) -> int:
    """Global micro-batches Megatron's schedule reads per iteration (forward_step calls), as
    Megatron counts them: training's (no batch-size ramp-up: validate refuses it), or evaluate()'s."""
    dp = int(args.data_parallel_size) * int(getattr(args, "gtp_weight_remat_size", 1) or 1)
    if evaluation:
        gbs = getattr(args, "eval_global_batch_size", None) or args.global_batch_size
        mbs = getattr(args, "eval_micro_batch_size", None) or args.micro_batch_size
    else:
        gbs, mbs = args.global_batch_size, args.micro_batch_size
    return max(1, int(gbs) // (int(mbs) * dp))


def _joint(batches, planner, k: int, say: bool = True, stages: int = 1):
    """``batches`` regrouped k at a time by the joint assignment (data.py JointBatches) with the
    run's cost model and capacity (``stages``: the pipeline's, which rounds' fill reads);
    ``--zeppelin-debug-plan`` prints each regrouping on rank 0 (where ``say``: the first model
    chunk's iterators, not the later chunks' same regroupings)."""
    from megatron_zeppelin.integration.data import JointBatches
    from megatron_zeppelin.planner.accumulation import document_s, joint_indices

    if k == 1:  # one micro-batch per iteration: nothing to assign
        return batches
    world = planner.topology.world_size

    def order(steps):
        out = joint_indices(steps, planner.cost, planner.config.capacity_tokens, world,
                            planner.config.accumulation, stages=stages)
        if say and planner.config.debug_plan and (not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0):
            docs = [L for s in steps for L in s]
            work = [[sum(document_s(planner.cost, L) for L in s) for s in steps],
                    [sum(document_s(planner.cost, docs[i]) for i in m) for m in out]]
            skew = [max(w) / (sum(w) / len(w)) for w in work]
            print(f"zeppelin {planner.config.accumulation.value}: {len(steps)} micro-batches, tokens "
                  f"{','.join(str(sum(s)) for s in steps)} -> {','.join(str(sum(docs[i] for i in m)) for m in out)}, "
                  f"predicted work max/mean {skew[0]:.3f} -> {skew[1]:.3f}", flush=True)
        return out

    return JointBatches(batches, k, order, _doc_lengths)


def _stage_check(args):
    """With pipeline parallelism, the comparison of plans across this rank's pipeline stages
    (plan_check.StagePlanCheck), made here, where every rank arrives together, and kept on args."""
    from datetime import timedelta

    from megatron.core import parallel_state as ps

    from megatron_zeppelin.integration.plan_check import StagePlanCheck

    if ps.get_pipeline_model_parallel_world_size() == 1 or getattr(args, "_zeppelin_stage_check", None):
        return
    ranks = torch.distributed.get_process_group_ranks(ps.get_pipeline_model_parallel_group())
    args._zeppelin_stage_check = StagePlanCheck(ranks, timedelta(minutes=args.distributed_timeout_minutes))


def _doc_lengths(docs) -> list:
    """Trained tokens per document of a batch (each document holds its L + 1 tokens)."""
    return [d.numel() - 1 for d in docs]


def loss_func(label_tokens: int, output_tensor: torch.Tensor, loss_mask: Optional[torch.Tensor] = None):
    """Per-token loss sum, token count and report, after Megatron's NaN / Inf / spiky-loss checks."""
    from megatron.core.rerun_state_machine import get_rerun_state_machine
    from megatron.training import get_args

    if loss_mask is None:  # Zeppelin: per-token losses [1, t_lin], pad rows beyond label_tokens
        loss = output_tensor[:, :label_tokens].float().sum()
    else:
        loss = (output_tensor.view(-1).float() * loss_mask.view(-1).float()).sum()
    num = torch.tensor(label_tokens, dtype=torch.int, device=loss.device)
    args = get_args()
    rsm = get_rerun_state_machine()
    if args.check_for_nan_in_loss_and_grad:
        rsm.validate_result(result=loss, rejection_func=torch.isnan, tolerance=0.0, fatal=True,
                            message="found NaN in local forward loss calculation")
        rsm.validate_result(result=loss, rejection_func=torch.isinf, tolerance=0.0, fatal=True,
                            message="found Inf in local forward loss calculation")
    if args.check_for_spiky_loss:
        rsm.validate_result(result=loss, rejection_func=partial(rsm.is_unexpectedly_large, threshold=SPIKY_LOSS_FACTOR,
                                                                context="loss"),
                            message="Spiky loss", tolerance=0.0, fatal=False)
    report = torch.stack([loss.detach().clone(), num.float()])
    return loss, num, {"lm loss": report}


def _domain(args):
    """(ZeppelinConfig, Topology, ModelSpec) of the run's DP domain, from Megatron's args."""
    from megatron.core import parallel_state as ps

    from megatron_zeppelin.spec.topology import Topology

    cfg = config_from_args(args)
    topo = Topology.from_world(ps.get_data_parallel_world_size(), cfg.gpus_per_node, cfg.nics_per_node,
                               cfg.gpu_nic_map)
    spec = model_spec(args)
    if _joint_applies(cfg, args):
        cfg = _joint_config(args, topo, spec, cfg)
    return cfg, topo, spec


def _joint_applies(cfg, args) -> bool:
    """The config regroups (planner/accumulation.py) and an iteration has micro-batches to regroup:
    with one per iteration (training's and evaluation's) every accumulation is data order, planned
    with the planner's own capacity as before the default became rounds."""
    from megatron_zeppelin.planner.accumulation import joint_applies
    return joint_applies(cfg) and max(_micro_batches(args, False), _micro_batches(args, True)) > 1


def _joint_config(args, topo, spec, cfg):
    """With joint assignment every micro-batch is planned with the capacity of the largest
    data-order one (planner/accumulation.py): here each holds exactly a global micro-batch's
    tokens, so that capacity is the run's; kept on args (the same every step)."""
    from megatron_zeppelin.planner.accumulation import joint_config
    from megatron_zeppelin.spec.hardware import load_profile

    tokens = int(args.seq_length) * int(args.micro_batch_size) * topo.world_size
    key = (cfg, topo, spec, tokens)
    held = getattr(args, "_zeppelin_joint_config", None)
    if held is None or held[0] != key:
        held = (key, joint_config(topo, load_profile(cfg.cluster), spec, cfg, tokens))
        args._zeppelin_joint_config = held
    return held[1]


def model_spec(args):
    """The ModelSpec the planner prices, from Megatron's model flags. K/V heads are
    ``--num-query-groups`` only with ``--group-query-attention``, as Megatron's transformer config
    reads them (its default of 1 is not the model's otherwise, and its FLOPs counter sets it to the
    head count after the first iteration: a spec read from it then changed, and with it the run's
    Planner).

    >>> import argparse
    >>> a = argparse.Namespace(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=1,
    ...                        group_query_attention=False, ffn_hidden_size=64, padded_vocab_size=128, kv_channels=None)
    >>> model_spec(a).kv_heads, model_spec(argparse.Namespace(**{**vars(a), "group_query_attention": True})).kv_heads
    (4, 1)
    """
    from megatron_zeppelin.spec.model import ModelSpec
    gqa = getattr(args, "group_query_attention", False) and args.num_query_groups
    return ModelSpec(name="megatron", layers=args.num_layers, hidden=args.hidden_size,
                     heads=args.num_attention_heads, kv_heads=args.num_query_groups if gqa else args.num_attention_heads,
                     ffn=args.ffn_hidden_size, vocab=args.padded_vocab_size,
                     head_dim=args.kv_channels or args.hidden_size // args.num_attention_heads)


def _run_planner(args, topo, spec, cfg):
    """The run's Planner (its cost model built once, not per micro-batch), kept on Megatron's args,
    which live as long as the run; rebuilt if the topology, model or config differ."""
    from megatron_zeppelin.planner import Planner
    from megatron_zeppelin.spec.hardware import load_profile
    key = (topo, spec, cfg)
    held = getattr(args, "_zeppelin_planner", None)
    if held is None or held[0] != key:
        held = (key, Planner(topo, load_profile(cfg.cluster), spec, cfg))
        args._zeppelin_planner = held
    return held[1]


def _model_chunk(model) -> int:
    """The model chunk (Megatron's ``vp_stage``, kept on the chunk's GPTModel and copied by its
    Float16Module) ``model`` is, under its wrappers; 0 without virtual pipeline stages.

    >>> from types import SimpleNamespace as Wrapped
    >>> _model_chunk(Wrapped(module=Wrapped(module=Wrapped(vp_stage=1)))), _model_chunk(Wrapped(vp_stage=None, module=None))
    (1, 0)
    """
    while model is not None:
        vp = getattr(model, "vp_stage", None)
        if vp is not None:
            return int(vp)
        model = getattr(model, "module", None)
    return 0


def _plan_of(args, planner, lengths, chunk: int, chunks: int):
    """This forward's Plan and how it came (for --zeppelin-debug-plan). The first model chunk takes
    it, planned ahead (plan_ahead.py) or shared (plan_share.py) or planned now, and keeps it for the
    rank's later chunks, which take it back (chunk_plans.py)."""
    from megatron_zeppelin.integration.chunk_plans import ChunkPlans

    held = getattr(args, "_zeppelin_chunk_plans", None)
    if held is None or held.later != chunks - 1:
        held = args._zeppelin_chunk_plans = ChunkPlans(chunks)
    if chunk > 0:
        plan = held.take(lengths)
        if plan is not None:
            return plan, " kept from chunk 0"
        # never reached while chunk 0 runs each micro-batch first (chunk_plans.py); planned here,
        # it is still the same Plan, and no peer waits for a share of it
        return planner.plan(lengths), " planned in the step (chunk 0 kept none)"
    ahead = getattr(args, "_zeppelin_plan_ahead", None)
    if ahead is not None and ahead.planner is planner:  # planned while the previous batch trained
        plan = ahead.take(lengths)
        how = f" {'planned ahead' if ahead.ahead else 'planned in the step'}, waited {1e3 * ahead.waited_s:.1f} ms"
        share = getattr(ahead, "share", None)
        how += f", shared by rank {share.src}" if share is not None else ""
    else:
        plan, how = planner.plan(lengths), ""
    held.keep(lengths, plan)
    return plan, how


def _empty_step(args, dp_rank: int):
    """An empty micro-batch's forward: no layer runs and no Plan is made or compared (every rank of
    the domain regrouped the same lengths alike, so all are here together); its loss is a zero over
    no tokens that Megatron's backward can run (a leaf of no elements, no parameter reached), adding
    nothing to the iteration's per-token loss or gradients. The only cost is Megatron's step call."""
    if getattr(args, "zeppelin_debug_plan", False) and dp_rank == 0:
        print("zeppelin empty micro-batch: no documents, no layer runs\n", end="", flush=True)
    out = torch.zeros((1, 0), device=torch.cuda.current_device(), requires_grad=True)
    return out, partial(loss_func, 0)


def forward_step(data_iterator, model, return_schedule_plan: bool = False):
    from megatron.core import parallel_state as ps
    from megatron.training import get_args

    args = get_args()
    docs = next(data_iterator)
    group = ps.get_data_parallel_group()
    if not getattr(args, "zeppelin_balance", False):
        from megatron_zeppelin.integration.stock_batch import stock_rank_batch
        b = stock_rank_batch(docs, ps.get_data_parallel_rank(), ps.get_data_parallel_world_size(),
                             max_doc_tokens(args), device=torch.cuda.current_device())
        out = model(b.tokens, b.position_ids, None, labels=b.labels)
        return out, partial(loss_func, b.label_tokens, loss_mask=b.loss_mask)

    if not docs:  # rounds left Megatron's step empty (data.py JointBatches): every rank of the domain alike
        return _empty_step(args, ps.get_data_parallel_rank())

    from megatron_zeppelin.attention.kernels import Kernel
    from megatron_zeppelin.integration.batch import build_rank_batch, default_engine_factory
    from megatron_zeppelin.integration.plan_check import check_plan_agreement

    cfg, topo, spec = _domain(args)
    planner = _run_planner(args, topo, spec, cfg)
    chunk, chunks = _model_chunk(model), int(getattr(args, "virtual_pipeline_model_parallel_size", None) or 1)
    plan, how = _plan_of(args, planner, _doc_lengths(docs), chunk, chunks)
    if chunk == 0 and (cfg.debug_plan or not getattr(forward_step, "_checked", False)):
        # once per micro-batch (its later chunks run the very Plan checked here), so the stages'
        # comparisons pair up micro-batch by micro-batch
        check_plan_agreement(plan, group)  # over the stage's domain, now
        stages = getattr(args, "_zeppelin_stage_check", None)
        if stages is not None:  # across the pipeline's stages, when the phase ends
            phase = (getattr(args, "curr_iteration", 0), model.training)
            stages.submit(plan, phase, f"a {'training' if model.training else 'evaluation'} micro-batch of "
                                       f"iteration {phase[0] + 1}")
        forward_step._checked = True
    if cfg.debug_plan and ps.get_data_parallel_rank() == 0:
        remap = any(tuple(a) != tuple(b) for a, b in zip(plan.attention_layout, plan.linear_layout))
        counts = " ".join(f"{c}={n}" for c, n in plan.class_counts().items())
        comms = ",".join(sorted({str(r.comm) for r in plan.rings}))  # the rings' exchange kinds
        stage = f" stage={ps.get_pipeline_model_parallel_rank()}" if ps.get_pipeline_model_parallel_world_size() > 1 else ""
        stage += f" chunk={chunk}" if chunks > 1 else ""
        # one write with its newline: the stages' DP rank 0 share torchrun's pipe, and print's
        # separate newline let their lines run into each other
        print(f"zeppelin plan: {counts} remap={remap}{f' comm={comms}' if comms else ''}{how}{stage} "
              f"digest={plan.digest()}\n", end="", flush=True)
    kernel = Kernel(getattr(args, "zeppelin_attention_kernel", "auto"), getattr(args, "transformer_impl", None))
    batch = build_rank_batch(docs, plan, ps.get_data_parallel_rank(), group,
                             softmax_scale=spec.head_dim ** -0.5, device=torch.cuda.current_device(),
                             engine_factory=partial(default_engine_factory, kernel=kernel),
                             sp_group=ps.get_tensor_model_parallel_group() if cfg.sequence_parallel else None)
    out = model(batch.tokens, batch.position_ids, None, labels=batch.labels,
                packed_seq_params=batch.packed_seq_params)
    return out, partial(loss_func, batch.label_tokens)
