"""The strategy protocol: the registry holds one strategy under each name --zeppelin-strategy takes
(spec/config.py STRATEGIES), and one place (strategies.choose) assembles what a strategy proposes
and keeps the least predicted plan, skipping candidates bounded above the best so far and those
that do not fit."""

import pytest

from megatron_zeppelin.spec.config import STRATEGIES, ConfigError, ZeppelinConfig
from megatron_zeppelin.planner.baselines.packed_dp import plan_packed_dp
from megatron_zeppelin.planner.baselines.static_cp import cp_placement
from megatron_zeppelin.planner.strategies import Candidate, choose, get_strategy, names, pick, strategy
from megatron_zeppelin.planner.testing import toy_context
from megatron_zeppelin.planner.types import PlanError

LENGTHS = [3000, 900, 400, 300, 200, 100]


def test_the_names_come_from_the_registry():
    assert STRATEGIES == names() and names()[0] == "zeppelin" and len(set(names())) == len(names()) == 6
    assert get_strategy("static_cp").source.endswith("baselines.static_cp.plan_static_cp")
    with pytest.raises(ConfigError, match="one of zeppelin, packed_dp"):
        ZeppelinConfig(strategy="nope")
    with pytest.raises(PlanError, match="two strategies are registered as 'packed_dp'"):
        strategy("packed_dp", 1)(lambda lengths, ctx: None)
    with pytest.raises(PlanError, match="'nope' is not a StrategyName"):  # a name the flags refuse
        strategy("nope", 9)(lambda lengths, ctx: None)
    assert "nope" not in names()


def test_choose_keeps_the_least_predicted_and_prunes_by_bound():
    ctx = toy_context(nodes=1, gpus=4)
    packed, cp4 = plan_packed_dp(LENGTHS, ctx), cp_placement(LENGTHS, ctx, 4, "p2p")
    seen = []

    def propose(lengths, c, search):
        seen.append(search.best_s)
        yield Candidate(packed, "packed")
        seen.append(search.best_s)
        yield Candidate(cp4, "cp4")
        seen.append(search.best_s)
        yield Candidate(packed, "never assembled", bound=float("inf"))

    plan, won = choose("zeppelin", LENGTHS, ctx, propose)
    times = {lb: choose("zeppelin", LENGTHS, ctx, lambda l, c, s, p=p, lb=lb: [Candidate(p, lb)])[0].predicted_iteration_s
             for lb, p in (("packed", packed), ("cp4", cp4))}
    assert seen[0] == float("inf") and seen[1] == times["packed"] and seen[2] == min(times.values())
    assert won.label == min(times, key=times.get) == plan.meta.variant
    assert plan.predicted_iteration_s == min(times.values())


def test_choose_skips_what_does_not_fit_and_names_the_last_error():
    ctx = toy_context(nodes=1, gpus=4, config=ZeppelinConfig(gpus_per_node=4, capacity_tokens=1500))
    with pytest.raises(PlanError, match="runs out of memory"):  # packed_dp keeps the 3000-token document whole
        choose("packed_dp", LENGTHS, ctx, lambda l, c, s: [Candidate(plan_packed_dp(l, c))])
    plan, _ = pick("zeppelin", LENGTHS, ctx)
    assert max(plan.tokens(r) for r in range(4)) <= 1500
