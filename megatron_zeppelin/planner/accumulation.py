"""Gradient accumulation that Zeppelin plans: which of a global batch's documents go in which of its
k micro-batches (``--zeppelin-accumulation``).

An iteration of Megatron's ``--global-batch-size`` is k micro-batches whose gradients add up before
the one DP reduce, so which document lands in which micro-batch does not change the update: the
assignment is free. ``data_order`` keeps the loader's (micro-batch j holds what it read j-th, each
planned on its own, as before). ``joint`` pools the k micro-batches' documents and assigns them
together, as WLB-LLM's workload-aware variable-length packing does across micro-batches (Wang et
al., "WLB-LLM: Workload-Balanced 4D Parallelism for Large Language Model Training", OSDI'25, arXiv
2503.17924, sec. 4): longest processing time first on the cost model's prediction of each document
alone (its causal attention, forward and backward of every layer, plus its linear work), each to the
micro-batch of least predicted work so far that has token room for it. Long documents, the ones a
plan must split and whose attention dominates, so spread over the micro-batches first and short ones
fill in; each micro-batch then gets a similar mix, which Zeppelin balances over the ranks as before,
and with pipeline stages the micro-batches cost about the same (planner/iteration.py ``one_f_one_b``:
what an uneven micro-batch costs there).

``by_length`` pools them too, but puts documents of like length together, as Megatron's dynamic-CP
scheduler packs a global batch into rounds (megatron/core/pipeline_parallel/hybrid_cp_schedule.py
``get_groups_and_subsamples`` sorts the iteration's sequences longest first, as our port,
planner/baselines/dynamic_cp.py, does): longest first, each into the first micro-batch with token
room for it (first-fit decreasing), the room the largest data-order micro-batch's tokens. The first micro-batches then hold the long documents, which Zeppelin spreads over
every rank at once, and the last the short ones, which stay local: where memory is tight a mixed
micro-batch cannot balance (the ranks of a long document's ring hold few other tokens, the rest at
most the capacity), a micro-batch of like documents can. Its micro-batches are uneven, which 1F1B
pays for in bubbles, yet in docs/results.md's pipeline study it beats joint's even ones from 4
stages on: how well each micro-batch balances outweighs the bubbles there.

``rounds`` pools them and packs them as Megatron's dynamic-CP scheduler packs a global batch into
HDP rounds (planner/baselines/dynamic_cp.py ``dynamic_cp_rounds``, its packing-aware rules, on the
real lengths, at ``max_seqlen_per_dp_cp_rank`` = the least fill, from the data-order micro-batches'
per-rank share (or, where the capacity allows, the longest document's length over a node's ranks, so
that it stays inside one node) up to the capacity, at which k rounds hold the iteration:
``round_fill``): longest
first, each round filled up to that on every rank, a long document beside the shorter ones that fit
around its group (not only like lengths: by_length's first micro-batch of five 25-30K documents on
32 ranks could not balance at 90% of memory, the scheduler's round of twelve documents at 100%
could). Where fewer rounds hold the iteration than Megatron's k micro-batches, Megatron's k forward
steps run the rounds and, before them, empty micro-batches (integration/data.py JointBatches): an
empty one trains nothing and runs no layer (integration/megatron_lm.py ``forward_step``), so the
iteration costs its rounds, as Megatron's dynamic CP, which runs as many micro-batches as its rounds
(the benchmark's dynamic_cp, sim/runs.py). With pipeline stages an empty micro-batch cannot pass
through them: there each micro-batch beyond the rounds takes the shortest document of the round
holding the most. Where the scheduler needs more than k rounds even at the capacity, by_length's
grouping.

Memory as the capacity says: a micro-batch's room is the largest data-order micro-batch's tokens
(joint: plus ``TOKEN_SLACK``, whole documents rarely pack exactly), never above what the domain holds
(capacity x ranks), and every micro-batch is planned with the per-rank capacity the largest
data-order micro-batch had (the set ``--zeppelin-capacity-tokens``, or the planner's default of
twice its mean). A document that finds no room goes where the most room is left.

Only Zeppelin is given it: a baseline keeps its real system's assignment (``JOINT_STRATEGIES``; the
benchmark runs dynamic_cp over the whole global batch, as Megatron's scheduler does, sim/runs.py).

>>> from megatron_zeppelin.planner.testing import toy_context
>>> ctx = toy_context(gpus=4)
>>> steps = [[6000, 6000, 500, 500], [1500] * 4 + [1000] * 2, [2000] * 3 + [1000]]   # in data order
>>> def us(ss):
...     return [round(1e6 * sum(document_s(ctx.cost, L) for L in s)) for s in ss]
>>> us(steps)                                  # predicted microseconds: both long documents in the first
[841, 198, 205]
>>> joint = assign_micro_batches(steps, ctx.cost, room=13000)
>>> joint, us(joint)                           # one long document each, the short ones fill in
([[6000, 500, 1000], [6000, 500, 1000], [1500, 1500, 1500, 1500, 1000, 2000, 2000, 2000]], [442, 442, 362])
>>> docs = [L for s in steps for L in s]
>>> by_length = [[docs[i] for i in m] for m in length_indices(steps, room=13000)]
>>> by_length, us(by_length)                   # both long documents together, then the rest by length
([[6000, 6000, 1000], [1500, 1500, 1500, 1500, 1000, 2000, 2000, 2000], [500, 500, 1000]], [846, 362, 37])
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from megatron_zeppelin.planner.cost.cost_model import CostModel
from megatron_zeppelin.planner.iteration import Iteration
from megatron_zeppelin.spec.config import ZeppelinConfig
from megatron_zeppelin.spec.hardware import HardwareProfile
from megatron_zeppelin.spec.model import ModelSpec
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.spec.words import Accumulation, StrategyName

FILL_STEPS = 8  # rounds' fill climbs from the least in steps of 1/FILL_STEPS of it (round_indices)
TOKEN_SLACK = 0.05  # a micro-batch may hold this much more than the largest data-order one (whole documents)
JOINT_STRATEGIES = (StrategyName.ZEPPELIN,)  # the strategies an assigning --zeppelin-accumulation applies to
ASSIGNING = (Accumulation.JOINT, Accumulation.BY_LENGTH, Accumulation.ROUNDS)  # the accumulations that regroup


def document_s(cost: CostModel, length: int) -> float:
    """A document's predicted seconds alone on one rank: attention and linear work, forward and backward."""
    return float(cost.doc_attention_s(length)) + float(cost.linear_s(length))


def assign_micro_batches(steps: Sequence[Sequence[int]], cost: CostModel, room: int,
                         hard_room: int = 0) -> List[List[int]]:
    """The documents of ``steps`` (the data-order micro-batches) in as many micro-batches, assigned
    jointly: the lengths of ``assign_indices``'s micro-batches."""
    docs = [int(L) for s in steps for L in s]
    return [[docs[i] for i in m] for m in assign_indices(steps, cost, room, hard_room)]


def assign_indices(steps: Sequence[Sequence[int]], cost: CostModel, room: int,
                   hard_room: int = 0) -> List[List[int]]:
    """Which documents go in which micro-batch, as indices into ``steps``'s documents in data order
    (micro-batch 0's first, then 1's, ...): longest predicted first (ties: longer, then earlier),
    each to the micro-batch of least predicted seconds (ties: the first) with ``room`` tokens left
    for it, else to the one with the most room left, if that stays within ``hard_room`` (0: no
    such limit; else a ValueError); data order itself where that does not lower the busiest
    micro-batch's predicted seconds. Each micro-batch keeps its documents in data order (module doc).
    A training data path moves its documents with these (integration/data.py ``JointBatches``)."""
    docs = [int(L) for s in steps for L in s]
    k = len(steps)
    seconds = {L: document_s(cost, L) for L in set(docs)}
    order = sorted(range(len(docs)), key=lambda i: (-seconds[docs[i]], -docs[i], i))
    load, tokens = [0.0] * k, [0] * k
    members: List[List[int]] = [[] for _ in range(k)]
    for i in order:
        L = docs[i]
        fits = [j for j in range(k) if tokens[j] + L <= room]
        if fits:
            j = min(fits, key=lambda j: (load[j], j))
        else:
            j = min(range(k), key=lambda j: (tokens[j], j))
            if hard_room and tokens[j] + L > hard_room:
                raise ValueError(f"document of {L} tokens fits no micro-batch within {hard_room} tokens")
        members[j].append(i)
        load[j] += seconds[L]
        tokens[j] += L
    joint = [sorted(m) for m in members]
    # LPT under the token room can end a hair behind data order: keep data order unless the joint
    # assignment predicts a less busy busiest micro-batch (the mean is the same documents' either way)
    cuts = [0]
    for s in steps:
        cuts.append(cuts[-1] + len(s))
    data = [list(range(a, b)) for a, b in zip(cuts, cuts[1:])]
    busiest = [max(sum(seconds[docs[i]] for i in m) for m in ms) for ms in (joint, data)]
    return joint if busiest[0] < busiest[1] else data


def length_indices(steps: Sequence[Sequence[int]], room: int, hard_room: int = 0) -> List[List[int]]:
    """Which documents go in which micro-batch (as ``assign_indices``), documents of like length
    together: longest first (ties: the earlier), each into the first micro-batch with ``room``
    tokens left for it, else into the one with the most room left, if that stays within
    ``hard_room`` (0: no such limit; else a ValueError). A micro-batch left empty takes the shortest
    document of the one holding the most. Each keeps its documents in data order (module doc)."""
    docs = [int(L) for s in steps for L in s]
    k = len(steps)
    tokens = [0] * k
    members: List[List[int]] = [[] for _ in range(k)]
    for i in sorted(range(len(docs)), key=lambda i: (-docs[i], i)):
        L = docs[i]
        j = next((j for j in range(k) if tokens[j] + L <= room), None)
        if j is None:
            j = min(range(k), key=lambda j: (tokens[j], j))
            if hard_room and tokens[j] + L > hard_room:
                raise ValueError(f"document of {L} tokens fits no micro-batch within {hard_room} tokens")
        members[j].append(i)
        tokens[j] += L
    for j in range(k):  # every micro-batch trains something (Megatron runs k forward steps)
        if not members[j]:
            most = max(range(k), key=lambda m: (len(members[m]), -m))
            members[j].append(members[most].pop())  # its last: the shortest (longest first)
    return [sorted(m) for m in members]


def round_indices(steps: Sequence[Sequence[int]], cost: CostModel, capacity: int,
                  most: int = 0, every_step: bool = False) -> Optional[List[List[int]]]:
    """Which documents go in which micro-batch (as ``assign_indices``): the HDP rounds Megatron's
    dynamic-CP scheduler packs them into at ``max_seqlen_per_dp_cp_rank`` = ``capacity`` (per-rank
    tokens, on the real lengths), or, where those are more than the micro-batches, at the least of
    ``capacity`` x (1 + j / FILL_STEPS) up to ``most`` at which they are not, in its order, longest
    first; None where the rounds are more than the micro-batches at every fill. Fewer rounds than
    micro-batches stay fewer (the rest run empty: module doc), unless ``every_step`` (pipeline
    stages): then the round holding the most documents gives its shortest (ties: the later) to a
    micro-batch of its own, at the end, until there are as many. Each keeps its documents in data
    order (module doc). Raises PlanError where the longest document does not fit the domain.

    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> ctx = toy_context(gpus=4, capacity=4000)
    >>> steps = [[6000, 500, 3000, 1000], [6000, 2000, 200], [1500, 800]]
    >>> docs = [L for s in steps for L in s]
    >>> [[docs[i] for i in m] for m in round_indices(steps, ctx.cost, 4000)]  # two rounds, the first all 4 x 4000
    [[6000, 500, 6000, 2000, 1500], [3000, 1000, 200, 800]]
    >>> [[docs[i] for i in m] for m in round_indices(steps, ctx.cost, 4000, every_step=True)]  # the third: its 500
    [[6000, 6000, 2000, 1500], [3000, 1000, 200, 800], [500]]
    """
    from megatron_zeppelin.planner import make_context
    from megatron_zeppelin.planner.baselines.dynamic_cp import dynamic_cp_rounds
    from megatron_zeppelin.planner.types import PlanError
    from megatron_zeppelin.spec.config import ZeppelinConfig
    topo = cost.topology  # the scheduler reads the domain and the capacity of a batch's context
    docs = [int(L) for s in steps for L in s]
    top = max(capacity, most)
    fill, j = capacity, 0
    while True:  # capacity x (1 + j / FILL_STEPS), up to ``top``
        ctx = make_context(topo, cost.profile, cost.model,
                           ZeppelinConfig(gpus_per_node=topo.gpus_per_node, capacity_tokens=fill), cost=cost)
        try:
            members = [sorted(r) for r in dynamic_cp_rounds(docs, ctx, fill, pad=False)]
        except PlanError:  # a document too long for this fill: a fuller one may hold it
            if fill == top:
                raise
            members = None
        if fill == top or (members is not None and len(members) <= len(steps)):
            break
        while min(top, capacity + capacity * j // FILL_STEPS) == fill:  # the next larger fill
            j += 1
        fill = min(top, capacity + capacity * j // FILL_STEPS)
    if len(members) > len(steps):
        return None
    while every_step and len(members) < len(steps):
        fullest = max(range(len(members)), key=lambda m: (len(members[m]), -m))
        shortest = min(members[fullest], key=lambda i: (docs[i], -i))
        members[fullest].remove(shortest)
        members.append([shortest])
    return members


def round_fill(steps: Sequence[Sequence[int]], world: int, capacity: int, node_ranks: int = 0) -> Tuple[int, int]:
    """(least, most) per-rank tokens ``rounds`` may pack each round up to (``round_indices`` takes
    the least at which its rounds fit the k micro-batches): from the largest data-order
    micro-batch's per-rank share up to ``capacity`` (the one the micro-batches are planned with).
    Filled to the capacity, the rounds were fewer than k, the last micro-batches nearly empty and the
    others full, which balance worse than k rounds each as full as the scheduler needs: on one
    iteration of each of 7 memory-bound accumulation configurations the least fill was faster in 6,
    by up to 11%, and 0.7% slower in one (``benchmarks/bench_accumulation_assign.py``,
    ``rounds_full``: docs/megatron.md). With pipeline stages, 1F1B also pays for uneven
    micro-batches in bubbles.

    With ``node_ranks`` ranks per node on more than one node, a round filled below the longest
    document's length over the node's ranks cannot hold that document inside one node: its ring
    then crosses the NIC in every layer where a fuller round keeps it on NVLink, as dynamic_cp's
    rounds at the capacity do. Where the capacity allows, the least fill is raised to that
    (h200 llama-13b TP 2 prolong64k 1M, 4 ranks a node, 64K documents: 13620 -> 16384 a rank, its
    second iteration 11.03 -> 10.40 s simulated, ``benchmarks/bench_accumulation_assign.py --only
    rounds rounds_share``: docs/megatron.md). Not with pipeline stages (the caller passes no
    ``node_ranks``): fuller rounds are more uneven, which 1F1B pays for in bubbles (h200 llama3-70b
    prolong64k 1M at 8 stages: the micro-batches' sum the same, 12.53 -> 14.74 s in 1F1B raised,
    ``rounds_node``).

    >>> round_fill([[3000, 1000], [2500, 2000]], 4, capacity=2250)
    (1125, 2250)
    >>> round_fill([[3000, 1000], [2500, 2000]], 4, capacity=2250, node_ranks=2)   # 3000 fits 2 x 1500
    (1500, 2250)
    >>> round_fill([[3000, 1000], [2500, 2000]], 4, capacity=1400, node_ranks=2)   # it cannot: no raise
    (1125, 1400)
    """
    largest = max(sum(int(L) for L in s) for s in steps)
    least = min(max(1, -(-largest // world)), capacity)
    if node_ranks >= 1 and world > node_ranks:  # more than one node: keep the longest inside one
        node = -(-max((int(L) for s in steps for L in s), default=0) // node_ranks)
        if least < node <= capacity:
            least = node
    return least, max(1, capacity)


def joint_indices(steps: Sequence[Sequence[int]], cost: CostModel, capacity: int, world: int,
                  how: Accumulation = Accumulation.JOINT, fill: Optional[Tuple[int, int]] = None,
                  stages: int = 1) -> List[List[int]]:
    """The micro-batches of ``steps`` assigned as ``how`` says (``assign_indices`` for joint,
    ``length_indices`` for by_length, ``round_indices`` for rounds, each round up to the least of the
    per-rank tokens ``fill`` (default ``round_fill``'s, a node's ranks given without pipeline
    ``stages``) allows at which they fit: by_length's where
    the scheduler needs more rounds than there are micro-batches at every fill) for
    micro-batches planned with per-rank ``capacity`` tokens on ``world`` ranks: the room of the module
    doc (the largest data-order micro-batch, plus ``TOKEN_SLACK`` for joint, within what the domain
    holds). Raises PlanError where a document fits no micro-batch."""
    from megatron_zeppelin.planner.types import PlanError
    how = Accumulation(how)
    largest = max(sum(int(L) for L in s) for s in steps)
    hard = capacity * world
    room = min(hard, int(largest * (1.0 + (TOKEN_SLACK if how == Accumulation.JOINT else 0.0))))
    if how == Accumulation.ROUNDS:
        try:
            node_ranks = cost.topology.gpus_per_node if stages <= 1 else 0
            rounds = round_indices(steps, cost, *(fill or round_fill(steps, world, capacity, node_ranks)),
                                   every_step=stages > 1)
        except PlanError as e:  # the scheduler's words name dynamic_cp: say which flag packed them
            raise PlanError(f"--zeppelin-accumulation rounds: {e}") from None
        if rounds is not None:
            return rounds
    try:
        if how in (Accumulation.BY_LENGTH, Accumulation.ROUNDS):
            return length_indices(steps, room, hard)
        return assign_indices(steps, cost, room, hard)
    except ValueError as e:
        raise PlanError(f"--zeppelin-accumulation {how.value}: {e} (the domain holds {hard} tokens: raise "
                        "--zeppelin-capacity-tokens or use --zeppelin-accumulation data_order)") from None


def joint_config(topology: Topology, profile: HardwareProfile, model: ModelSpec, config: ZeppelinConfig,
                 largest: int, cost: Optional[CostModel] = None) -> ZeppelinConfig:
    """The config a joint micro-batch is planned with: the per-rank capacity the largest data-order
    micro-batch (``largest`` tokens) had, the set one or the planner's default (``cost``: the run's
    cost model, else one is built)."""
    from megatron_zeppelin.planner import make_context
    ctx = make_context(topology, profile, model, config, total_tokens=largest, cost=cost)
    return config.with_(capacity_tokens=ctx.capacity)


def joint_steps(steps: Sequence[Sequence[int]], topology: Topology, profile: HardwareProfile, model: ModelSpec,
                config: ZeppelinConfig, how: Optional[Accumulation] = None, stages: int = 1
                ) -> Tuple[List[List[int]], ZeppelinConfig]:
    """(the micro-batches' lengths assigned as ``how`` says (default: the config's accumulation where
    it assigns, else joint), the config to plan each with: the capacity the largest data-order
    micro-batch had); ``stages``: pipeline stages (``joint_indices``). Raises PlanError where a
    document fits no micro-batch."""
    from megatron_zeppelin.planner import make_context
    largest = max(sum(int(L) for L in s) for s in steps)
    ctx = make_context(topology, profile, model, config, total_tokens=largest)
    docs = [int(L) for s in steps for L in s]
    how = how or (config.accumulation if config.accumulation in ASSIGNING else Accumulation.JOINT)
    out = [[docs[i] for i in m] for m in joint_indices(steps, ctx.cost, ctx.capacity, topology.world_size, how,
                                                        stages=stages)]
    return out, config.with_(capacity_tokens=ctx.capacity)


def joint_applies(config: ZeppelinConfig, strategy=None) -> bool:
    """Whether the iteration's micro-batches are assigned jointly: the config asks for it and the
    strategy (default the config's) takes it (``JOINT_STRATEGIES``)."""
    return config.accumulation in ASSIGNING and StrategyName(strategy or config.strategy) in JOINT_STRATEGIES


def plan_iteration(steps: Sequence[Sequence[int]], topology: Topology, profile: HardwareProfile,
                   model: ModelSpec, config: ZeppelinConfig, strategy=None, stages: int = 1) -> Iteration:
    """One iteration of the data-order micro-batches ``steps``: each planned with ``strategy``
    (default the config's), after joint assignment where the config asks for it and the strategy
    takes it (``JOINT_STRATEGIES``); ``stages``: pipeline stages (1F1B over the micro-batches)."""
    from megatron_zeppelin.planner import plan_batch
    name = StrategyName(strategy or config.strategy)
    if joint_applies(config, name) and len(steps) > 1:
        steps, config = joint_steps(steps, topology, profile, model, config, stages=stages)
    return Iteration(tuple(plan_batch(list(s), topology, profile, model, config, strategy=name) for s in steps),
                     stages=stages)
