"""The ``--zeppelin-*`` flags, in Megatron-LM's style, and the bridge to ZeppelinConfig.

``add_zeppelin_args`` is usable as Megatron-LM's ``extra_args_provider`` (it takes and returns the
parser). ``config_from_args`` reads them back (plus Megatron's own TP/CP/PP flags when present) and
refuses settings Zeppelin does not support yet, naming the flag.

>>> import argparse
>>> p = add_zeppelin_args(argparse.ArgumentParser())
>>> a = p.parse_args(["--zeppelin-balance", "--zeppelin-gpus-per-node", "2", "--zeppelin-gpu-nic-map", "0,0"])
>>> c = config_from_args(a)
>>> c.balance, c.gpus_per_node, c.gpu_nic_map, c.remap, c.accumulation
(True, 2, (0, 0), True, 'rounds')
>>> a.context_parallel_size = 2
>>> config_from_args(a)
Traceback (most recent call last):
...
megatron_zeppelin.spec.config.ConfigError: --zeppelin-balance plans context parallelism itself: set --context-parallel-size 1 (use --zeppelin-cp-size for the static_cp baseline)
"""

from __future__ import annotations

import argparse

from megatron_zeppelin.attention.kernels.select import BACKENDS as ATTENTION_KERNELS
from megatron_zeppelin.integration.plan_ahead import Worker
from megatron_zeppelin.spec.config import (ACCUMULATION, PLAN_SHARING, ROUTING, STRATEGIES, ConfigError, PlanSharing,
                                           ZeppelinConfig)
from megatron_zeppelin.spec.recompute import Recompute
from megatron_zeppelin.spec.token_counts import token_count


def _int_list(s: str):
    try:
        return tuple(int(x) for x in s.replace(" ", "").split(",") if x != "")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def add_zeppelin_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    g = parser.add_argument_group(title="zeppelin", description="Zeppelin variable-length balancing")
    g.add_argument("--zeppelin-balance", action="store_true",
                   help="Plan every global micro-batch with Zeppelin (local / intra / inter documents, "
                        "routing, remapping); needs the Zeppelin layer spec and batch path.")
    g.add_argument("--zeppelin-strategy", default="zeppelin", choices=STRATEGIES,
                   help="Planner: zeppelin, or a baseline run through the same engine.")
    g.add_argument("--zeppelin-gpus-per-node", type=int, default=None,
                   help="Domain (DP x CP) ranks per node (default: LOCAL_WORLD_SIZE, else 8, over the TP size).")
    g.add_argument("--zeppelin-nics-per-node", type=int, default=0,
                   help="NICs per node (0 = one per GPU, or the cluster profile's).")
    g.add_argument("--zeppelin-gpu-nic-map", type=_int_list, default=(),
                   help="NIC index of each local GPU, e.g. 0,0,1,1 (default: even sharing).")
    g.add_argument("--zeppelin-cluster", default="h200",
                   help="Hardware profile: a800, h800, h200 or a YAML path (cost model).")
    g.add_argument("--zeppelin-routing", default="auto", choices=ROUTING,
                   help="Route inter-node ring traffic over all NICs (auto = when the domain spans nodes).")
    g.add_argument("--zeppelin-remap", dest="zeppelin_remap", action="store_true", default=True,
                   help="Remap tokens to a token-balanced layout for the MLP and vocab head (default).")
    g.add_argument("--no-zeppelin-remap", dest="zeppelin_remap", action="store_false",
                   help="Keep the attention layout for the linear modules.")
    g.add_argument("--zeppelin-capacity-tokens", type=token_count, default=0,
                   help="Per-rank attention-layout token capacity (0 = twice the mean).")
    g.add_argument("--zeppelin-balance-memory", action="store_true",
                   help="Plan Zeppelin with every rank's attention- and linear-layout tokens within 1.10x the "
                        "batch's mean, so each rank's activation memory is within 1.10x the mean (the plan "
                        "without the cap where none fits under it): about 1%% more predicted time and more "
                        "planning time per batch (docs/partitioner.md).")
    g.add_argument("--zeppelin-cp-size", type=int, default=0,
                   help="CP group size for the static_cp / allgather_cp baselines (0 = auto).")
    g.add_argument("--zeppelin-cp-comm-type", choices=("auto", "p2p", "a2a", "a2a+p2p"), default="auto",
                   help="Transformer Engine cp_comm_type the static_cp baseline (and Zeppelin's static_cp "
                        "shapes) may use: p2p (ring), a2a (Ulysses: CP sizes dividing the heads), a2a+p2p "
                        "(hierarchical: a2a inside groups of a node's ranks, a ring of the groups), auto = all.")
    g.add_argument("--zeppelin-cp-a2a-size", type=int, default=0,
                   help="a2a+p2p's a2a group size, the a of Megatron's --hierarchical-context-parallel-sizes a p "
                        "(0 = every size dividing the GPUs of a node and the heads).")
    g.add_argument("--zeppelin-accumulation", choices=ACCUMULATION, default="rounds",
                   help="Documents of an iteration's global batch to its micro-batches (with one micro-batch "
                        "per iteration all are the same): rounds (the default: packed as Megatron's dynamic-CP "
                        "scheduler packs its rounds, each only as full as k rounds need, from the data-order "
                        "micro-batches' size up to the capacity: docs/megatron.md), data_order (as read), "
                        "joint (the planner spreads long documents over the micro-batches, evening them), or "
                        "by_length (documents of like length together, longest first); the same documents "
                        "per iteration (planner/accumulation.py; --zeppelin-strategy zeppelin only). Trained by "
                        "the Megatron-LM entry, planned by `zeppelin plan` / `simulate` / `bench`; `zeppelin "
                        "train` runs one micro-batch per step and refuses joint and by_length.")
    g.add_argument("--zeppelin-min-route-bytes", type=int, default=0,
                   help="Smallest inter-node message worth routing over several NICs (0 = from profile).")
    g.add_argument("--zeppelin-relay-chunk-bytes", type=int, default=None,
                   help="Largest chunk (bytes) of a routed piece: relays forward chunk by chunk, overlapping "
                        "dispatch, transfer and combine (0 = unpipelined; default: the profile's, 2 MiB on GPUs).")
    g.add_argument("--zeppelin-plan-ahead", dest="zeppelin_plan_ahead", action="store_true", default=True,
                   help="Megatron-LM entry: plan each global micro-batch on a worker (--zeppelin-plan-ahead-worker) "
                        "while the one before it trains (default; the same plans, off the step's critical path). "
                        "`zeppelin train` always plans in its step (its step times are measurements).")
    g.add_argument("--no-zeppelin-plan-ahead", dest="zeppelin_plan_ahead", action="store_false",
                   help="Megatron-LM entry: plan each batch in its forward step.")
    g.add_argument("--zeppelin-plan-ahead-worker", default=Worker.PROCESS.value,
                   choices=[w.value for w in Worker],
                   help="Megatron-LM entry, with plan-ahead: plan in a spawned process (default: planning never "
                        "holds the training process's GIL) or on a thread of it. Where no process can start, "
                        "it says so once and plans on a thread.")
    g.add_argument("--zeppelin-plan-sharing", default=None, choices=PLAN_SHARING,
                   help="Megatron-LM entry: one-per-domain = the domain's rank 0 plans each batch and broadcasts the "
                        "Plan over a gloo group of its own (the others unpickle it and check its digest); every-rank "
                        "= each rank plans it. Default: one-per-domain with plan-ahead (the broadcast is hidden with "
                        "the planning), every-rank with --no-zeppelin-plan-ahead.")
    g.add_argument("--zeppelin-plan-budget-ms", type=float, default=0.0,
                   help="Time Zeppelin's search may spend after its partitioner, on the baselines' shapes and "
                        "aligned rings, in deterministic work units (the same plan on any machine; plan.meta "
                        "names what it cut). 0 = 10%% of the predicted iteration, at least 50 ms.")
    g.add_argument("--zeppelin-debug-plan", action="store_true",
                   help="Compare plan digests across the domain every step (a mismatch is an error); "
                        "the Megatron-LM entry also prints each plan's document classes on rank 0.")
    g.add_argument("--zeppelin-attention-kernel", default="auto", choices=ATTENTION_KERNELS,
                   help="Attention kernel: auto = te with --transformer-impl transformer_engine when TE is "
                        "installed, else torch_flash on CUDA (fp16/bf16), cpu_flash on CPU (docs/attention.md).")
    return parser


def _get(args, name, default=None):
    v = getattr(args, name, default)
    return default if v is None else v


def check_megatron_args(args) -> None:
    """Megatron settings --zeppelin-balance cannot run with yet: a clear error naming the flag."""
    if not _get(args, "zeppelin_balance", False):
        return
    if _get(args, "context_parallel_size", 1) != 1:
        raise ConfigError("--zeppelin-balance plans context parallelism itself: set --context-parallel-size 1 "
                          "(use --zeppelin-cp-size for the static_cp baseline)")
    if _get(args, "overlap_moe_expert_parallel_comm", False):
        # Megatron's combined 1F1B asks the forward step for a schedule plan of the model's own
        # submodules (return_schedule_plan), which the planned forward does not build
        raise ConfigError("--zeppelin-balance does not support --overlap-moe-expert-parallel-comm: drop it")
    if _get(args, "num_microbatches_with_partial_activation_checkpoints", None) is not None:
        # Megatron passes the per-micro-batch checkpoint switch as forward_step's third argument,
        # which Megatron's forward steps (and ours) read as return_schedule_plan: it would be ignored
        raise ConfigError("--zeppelin-balance does not support --num-microbatches-with-partial-activation-"
                          "checkpoints: drop it (recompute is --recompute-granularity / --recompute-method)")
    if _get(args, "num_experts", None) and _get(args, "moe_token_dispatcher_type", "alltoall") == "flex":
        raise ConfigError("--zeppelin-balance runs MoE with the alltoall or allgather token dispatcher: "
                          "set --moe-token-dispatcher-type alltoall")
    if _get(args, "multi_latent_attention", False):
        raise ConfigError("--zeppelin-balance does not support --multi-latent-attention")
    if _get(args, "attention_dropout", 0.0):
        raise ConfigError("--zeppelin-balance needs --attention-dropout 0")
    if _get(args, "position_embedding_type", "rope") not in ("rope", "none"):
        raise ConfigError("--zeppelin-balance supports --position-embedding-type rope or none")
    if _get(args, "apply_rope_fusion", False) and _get(args, "position_embedding_type", "rope") == "rope":
        # megatron's fused RoPE wants sbhd [s, b, h, d] (or THD with cu_seqlens); Zeppelin hands per-token tables
        raise ConfigError("--zeppelin-balance needs --no-rope-fusion (per-token RoPE positions of the plan)")


def _plan_sharing(args) -> str:
    """--zeppelin-plan-sharing, or its default: one-per-domain where planning is ahead of the step
    (a receiving rank pays tens of ms to unpickle and check a Plan, against the seconds of planning
    it, and the broadcast is hidden with the planning), every-rank where the step plans (sharing
    would add the broadcast and the unpickling to the step).

    >>> p = add_zeppelin_args(argparse.ArgumentParser())
    >>> [_plan_sharing(p.parse_args(f)) for f in ([], ["--no-zeppelin-plan-ahead"])]
    ['one-per-domain', 'every-rank']
    """
    given = _get(args, "zeppelin_plan_sharing", None)
    if given is not None:
        return given
    return (PlanSharing.ONE_PER_DOMAIN if _get(args, "zeppelin_plan_ahead", True) else PlanSharing.EVERY_RANK).value


def config_from_args(args) -> ZeppelinConfig:
    """ZeppelinConfig from parsed flags (Megatron's or `zeppelin train`'s)."""
    import os

    check_megatron_args(args)
    tp = int(_get(args, "tensor_model_parallel_size", 1))
    # a node's domain ranks: its GPUs over TP (Megatron keeps each TP group inside a node)
    gpn = _get(args, "zeppelin_gpus_per_node", None) or max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 0) or 8) // tp)
    return ZeppelinConfig(
        balance=bool(_get(args, "zeppelin_balance", False)), strategy=_get(args, "zeppelin_strategy", "zeppelin"),
        gpus_per_node=int(gpn), nics_per_node=int(_get(args, "zeppelin_nics_per_node", 0)),
        gpu_nic_map=tuple(_get(args, "zeppelin_gpu_nic_map", ())), cluster=_get(args, "zeppelin_cluster", "h200"),
        routing=_get(args, "zeppelin_routing", "auto"), remap=bool(_get(args, "zeppelin_remap", True)),
        capacity_tokens=int(_get(args, "zeppelin_capacity_tokens", 0)), cp_size=int(_get(args, "zeppelin_cp_size", 0)),
        cp_comm=None if _get(args, "zeppelin_cp_comm_type", "auto") == "auto" else _get(args, "zeppelin_cp_comm_type"),
        cp_a2a_size=int(_get(args, "zeppelin_cp_a2a_size", 0)),
        balance_memory=bool(_get(args, "zeppelin_balance_memory", False)),
        min_route_bytes=int(_get(args, "zeppelin_min_route_bytes", 0)),
        relay_chunk_bytes=_get(args, "zeppelin_relay_chunk_bytes", None),
        debug_plan=bool(_get(args, "zeppelin_debug_plan", False)),
        plan_ahead=bool(_get(args, "zeppelin_plan_ahead", True)),
        plan_sharing=_plan_sharing(args),
        accumulation=_get(args, "zeppelin_accumulation", "rounds"),
        plan_budget_ms=float(_get(args, "zeppelin_plan_budget_ms", 0.0)),
        tp=tp,
        sequence_parallel=bool(_get(args, "sequence_parallel", False)),
        # Megatron's own recompute flags, so plans are priced with the forward the backward reruns
        # (with --recompute-method block, only the first --recompute-num-layers layers rerun it)
        recompute=Recompute.from_megatron(_get(args, "recompute_granularity", None),
                                          _get(args, "recompute_modules", None),
                                          _get(args, "recompute_method", None),
                                          _get(args, "recompute_num_layers", None)).describe())
