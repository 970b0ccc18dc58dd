"""The Megatron-LM entry's data path with ``--zeppelin-accumulation joint`` (integration/data.py
JointBatches, integration/megatron_lm.py ``_joint``): an iteration's k global micro-batches regrouped
by the planner's joint assignment keep their documents, stay within the room, and come out the same
on every rank; the capacity each is planned with is the data-order micro-batch's."""

import argparse

import pytest
import torch

from megatron_zeppelin.integration import megatron_lm as zl
from megatron_zeppelin.integration.megatron_lm import DocumentBatches
from megatron_zeppelin.planner import Planner
from megatron_zeppelin.planner.accumulation import TOKEN_SLACK, document_s, joint_config, round_fill
from megatron_zeppelin.planner.testing import TOY_MODEL, TOY_PROFILE
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.topology import Topology

TOKENS, K, ITERS = 1024, 4, 3  # trained tokens per global micro-batch, micro-batches per iteration


class Stream:
    """Documents in a fixed order (blend.DocumentStream's interface): document d holds L_d tokens, every
    token its position in the stream, so a regrouped document is recognisable."""

    def __init__(self, lengths):
        self.lengths = lengths

    def __getitem__(self, k):
        return k, self.lengths[k % len(self.lengths)]

    def document(self, k, n):
        return torch.arange(n, dtype=torch.int64) + 10_000 * k


# long documents come together in data order (as a loader may read them), short ones fill the rest
LENGTHS = [700, 650, 600, 40, 30] + [25, 60, 90, 12, 35, 80] * 40 + [900, 500, 20]


def _planner():
    topo = Topology(2, 2)
    cfg = ZeppelinConfig(gpus_per_node=2, accumulation="joint")
    return Planner(topo, TOY_PROFILE, TOY_MODEL, joint_config(topo, TOY_PROFILE, TOY_MODEL, cfg, TOKENS))


def _iterations(it, n=ITERS):
    return [[next(it) for _ in range(K)] for _ in range(n)]


def test_joint_regrouping_keeps_each_iterations_documents_and_balances_it():
    planner = _planner()
    order = _iterations(DocumentBatches(Stream(LENGTHS), TOKENS, 1000))
    joint = _iterations(zl._joint(DocumentBatches(Stream(LENGTHS), TOKENS, 1000), planner, K))
    room = int(TOKENS * (1 + TOKEN_SLACK))
    moved = 0
    for a, b in zip(order, joint):
        key = sorted(tuple(d.tolist()) for s in a for d in s)
        assert sorted(tuple(d.tolist()) for s in b for d in s) == key  # the same documents, cut alike
        assert all(sum(d.numel() - 1 for d in s) <= room for s in b)
        assert all([d[0].item() for d in s] == sorted(d[0].item() for d in s) for s in b)  # data order kept
        work = [[sum(document_s(planner.cost, d.numel() - 1) for d in s) for s in x] for x in (a, b)]
        assert max(work[1]) <= max(work[0])
        moved += [[d[0].item() for d in s] for s in a] != [[d[0].item() for d in s] for s in b]
    assert moved  # the long documents of the first iteration were spread


def test_every_rank_regroups_alike_and_one_micro_batch_is_left_alone():
    planner = _planner()
    runs = [_iterations(zl._joint(DocumentBatches(Stream(LENGTHS), TOKENS, 1000), planner, K)) for _ in range(2)]
    assert [[[d.tolist() for d in s] for s in it] for it in runs[0]] == \
        [[[d.tolist() for d in s] for s in it] for it in runs[1]]
    batches = DocumentBatches(Stream(LENGTHS), TOKENS, 1000)
    assert zl._joint(batches, planner, 1) is batches


def test_micro_batches_and_capacity_are_megatrons():
    args = argparse.Namespace(data_parallel_size=4, global_batch_size=32, micro_batch_size=2,
                              eval_global_batch_size=16, eval_micro_batch_size=2, gtp_weight_remat_size=1,
                              seq_length=128)
    assert zl._micro_batches(args, False) == 4 and zl._micro_batches(args, True) == 2
    topo = Topology(2, 2)
    cfg = ZeppelinConfig(gpus_per_node=2, accumulation="joint")
    got = zl._joint_config(args, topo, TOY_MODEL, cfg)
    # a data-order micro-batch holds 128 x 2 x 4 tokens: twice its mean per rank, as the planner's default
    assert got.capacity_tokens == 2 * 128 * 2 and got.with_(capacity_tokens=0) == cfg
    set_cap = cfg.with_(capacity_tokens=300)
    assert zl._joint_config(args, topo, TOY_MODEL, set_cap) == set_cap  # a set capacity stays


def test_by_length_regrouping_puts_the_long_documents_together_within_the_data_order_room():
    topo = Topology(2, 2)
    cfg = ZeppelinConfig(gpus_per_node=2, accumulation="by_length")
    planner = Planner(topo, TOY_PROFILE, TOY_MODEL, joint_config(topo, TOY_PROFILE, TOY_MODEL, cfg, TOKENS))
    order = _iterations(DocumentBatches(Stream(LENGTHS), TOKENS, 1000))
    grouped = _iterations(zl._joint(DocumentBatches(Stream(LENGTHS), TOKENS, 1000), planner, K))
    for a, b in zip(order, grouped):
        assert sorted(tuple(d.tolist()) for s in a for d in s) == sorted(tuple(d.tolist()) for s in b for d in s)
        largest = max(sum(d.numel() - 1 for d in s) for s in a)
        # the room is data order's largest (no slack); a short document that found no room goes over it
        assert all(0 < sum(d.numel() - 1 for d in s) <= largest + 90 for s in b)
        assert all([d[0].item() for d in s] == sorted(d[0].item() for d in s) for s in b)  # data order kept
        longest = max(d.numel() for s in a for d in s)
        assert any(d.numel() == longest for d in b[0])  # the longest documents open the iteration
    # short documents last: data order has 89-token documents in every micro-batch of the first iteration
    assert max(d.numel() - 1 for d in grouped[0][-1]) == 59 and max(d.numel() - 1 for d in order[0][-1]) == 89


@pytest.mark.parametrize("stages", [1, 2])
@pytest.mark.parametrize("set_capacity", [0, 4 * TOKENS // 4])
def test_rounds_regrouping_keeps_megatrons_micro_batches_each_about_data_orders_size(set_capacity, stages):
    topo = Topology(2, 2)
    cfg = ZeppelinConfig(gpus_per_node=2, accumulation="rounds", capacity_tokens=set_capacity)
    planned = joint_config(topo, TOY_PROFILE, TOY_MODEL, cfg, TOKENS)
    planner = Planner(topo, TOY_PROFILE, TOY_MODEL, planned)
    order = _iterations(DocumentBatches(Stream(LENGTHS), TOKENS, 1000))
    grouped = _iterations(zl._joint(DocumentBatches(Stream(LENGTHS), TOKENS, 1000), planner, K, stages=stages))
    raised = empty = 0
    for a, b in zip(order, grouped):
        assert sorted(tuple(d.tolist()) for s in a for d in s) == sorted(tuple(d.tolist()) for s in b for d in s)
        assert len(b) == len(a)  # Megatron's k micro-batches
        # with pipeline stages each trains something; without, fewer rounds leave the first ones empty
        trained = [bool(s) for s in b]
        assert all(trained) if stages > 1 else trained == sorted(trained) and trained[-1]
        empty += len(b) - sum(trained)
        # each round up to the least fill at which k rounds hold the iteration (accumulation.round_fill),
        # from data order's largest per-rank share, or where the capacity allows and no pipeline stages
        # pay for uneven rounds the longest document over a node's 2 ranks (it then stays in one
        # node), here at most one step of 1/8 above it
        share = -(-max(sum(d.numel() - 1 for d in s) for s in a) // topo.world_size)
        node = -(-max(d.numel() - 1 for s in a for d in s) // topo.gpus_per_node)
        least = round_fill([[d.numel() - 1 for d in s] for s in a], topo.world_size, planner.config.capacity_tokens,
                           topo.gpus_per_node if stages == 1 else 0)[0]
        assert least == (max(share, node) if node <= planner.config.capacity_tokens and stages == 1 else share)
        raised += least > share
        assert max(sum(d.numel() - 1 for d in s) for s in b) <= (least + least // 8) * topo.world_size
        assert all([d[0].item() for d in s] == sorted(d[0].item() for d in s) for s in b)  # data order kept
    assert any(len(a) and [len(s) for s in a] != [len(s) for s in b] for a, b in zip(order, grouped))
    assert (raised > 0) == (stages == 1)  # the node's fill is read, and only without stages
    assert (empty > 0) == (stages == 1)  # the node's fill packs fewer rounds: empty steps, only without stages
