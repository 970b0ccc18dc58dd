"""The search's budget, in deterministic work units: what Zeppelin may still weigh after its own partitioner.

The planner is pure (no clock), so a time budget cannot be read off a clock: it is converted to
*work units* at a planning rate (units per second of this planner on the host that plans,
``spec/config.PLAN_RATE_UNITS_PER_S``, measured by ``benchmarks/bench_planner.py --budget-rate``),
and each candidate is charged its units, estimated from its size before its costly steps run:
a placement's documents, ranks and ring messages (``placement_units``: what its preparation and
assembly walk, one schedule op per message, routed ones in three stages), a fixed shape's build
its documents and ranks. Same batch, same config: same units, same cuts, same plan, on any machine.

The paper's partitioner (the free-ring variants) runs first and is never cut; what follows, the
aligned-ring variants and the baselines' fixed shapes (portfolio/shapes.py), is weighed while the
units spent stay within the budget. The budget is ``--zeppelin-plan-budget-ms`` or, by default,
PLAN_SHARE of the best prediction after the partitioner (planning under 10% of the iteration it
plans), at least MIN_BUDGET_MS. What was cut lands in the plan's meta: ``cut_bound`` (fixed shapes
whose lower bound could not beat the best so far) and ``cut_budget`` (those skipped for units).

The budget itself, what it spent and cut, is ``planner/choice.py``'s SearchBudget (the pick holds it);
this module sizes the candidates.
"""

from __future__ import annotations

from megatron_zeppelin.spec.words import Comm, DocClass


def placement_units(placement, world: int, gpus_per_node: int) -> float:
    """Work units of preparing and assembling ``placement``: its documents, its ranks and one per
    ring message of a layer (zigzag G x G, a2a 2 G (G - 1), all-gather G (G - 1)), times three
    for a routed ring that spans nodes (dispatch, transfer, combine).

    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> from megatron_zeppelin.planner.baselines.static_cp import cp_placement
    >>> ctx = toy_context(nodes=2, gpus=2)
    >>> placement_units(cp_placement([4000, 3000, 2000], ctx, 4, Comm.P2P), 4, 2)   # 3 docs + 4 ranks + 16
    23.0
    """
    units = float(len(placement.docs) + world)
    for r in placement.rings:
        g = r.size
        n = {Comm.A2A: 2 * g * (g - 1), Comm.ALLGATHER: g * (g - 1)}.get(r.comm, g * g)
        spans = r.cls == DocClass.INTER or r.ranks[0] // gpus_per_node != r.ranks[-1] // gpus_per_node
        units += n * (3 if placement.routing and spans else 1)
    return units


def build_units(docs: int, world: int) -> float:
    """Work units of building one fixed shape's placement (its documents and ranks)."""
    return float(docs + world)
