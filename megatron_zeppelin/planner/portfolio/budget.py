"""The search's budget, in deterministic work units: what Zeppelin may still weigh after its own partitioner.

The planner is pure (no clock), so a time budget cannot be read off a clock: it is converted to
*work units* at a planning rate (units per second of this planner on the host that plans,
``spec/config.PLAN_RATE_UNITS_PER_S``, measured by ``benchmarks/bench_planner.py --budget-rate``),
and each candidate is charged its units, estimated from its size before its costly steps run:
a placement's documents, ranks and ring messages (``placement_units``: what its preparation and
assembly walk, one schedule op per message, routed ones in three stages), a fixed shape's build
its documents and ranks. Same batch, same config: same units, same cuts, same plan, on any machine.

The paper's partitioner (the free-ring and aligned-ring variants) runs first and is never cut (its
units are recorded, not spent); what follows, the baselines' fixed shapes (portfolio/shapes.py)
whose lower bound can still win, is weighed cheapest first while the units spent stay within the
budget (partition.py ``_weighed``). The budget is ``--zeppelin-plan-budget-ms``
or, by default, PLAN_SHARE of the best prediction after the partitioner, at least MIN_BUDGET_MS. What was cut lands in the plan's meta: ``cut_bound`` (fixed shapes
whose lower bound could not beat the best so far) and ``cut_budget`` (those skipped for units).

The budget itself, what it spent and cut, is ``planner/choice.py``'s SearchBudget (the pick holds it);
this module sizes the candidates.
"""

from __future__ import annotations

from megatron_zeppelin.spec.words import Comm, DocClass


# Units of the finer work a placement's preparation walks, relative to one unit of the rest:
# a ring's kernel blocks (documents x members x steps: the layer program prices each sequence of
# each call, program.py call_blocks_s) and a routed piece's chunk hops (each ordered, timed and
# relayed, program.py step_order). Measured against the planning rate by
# `benchmarks/bench_plan_units.py` (results/plan54/units.json): ~1.4 us a block, ~1.8 us a chunk hop;
# since the relays' rows are found once per exchange (program.step_feeds) ~0.6 us a chunk hop
# (results/aligned/units.json: 3.9e4-6.5e4 units per CPU second routed, 2.9e4-4.1e4 direct).
BLOCK_UNITS = 0.045
CHUNK_UNITS = 0.02


def placement_units(placement, world: int, gpus_per_node: int, chunk_rows: float = 0.0) -> float:
    """Work units of preparing and assembling ``placement``: its documents, its ranks and one per
    ring message of a layer (zigzag G x G, a2a 2 G (G - 1), all-gather G (G - 1)), times three
    for a routed ring that spans nodes (dispatch, transfer, combine); BLOCK_UNITS per kernel block
    of its rings (zigzag and all-gather: G x G per document, a2a: G, a2a+p2p: p x p x a); and, for a
    routed ring whose pieces are cut into chunks of ``chunk_rows`` token rows (``chunk_rows_of``;
    0: not cut), CHUNK_UNITS per chunk hop: its G steps pass the ring's tokens G times in the
    forward and twice in the backward, each chunk in three stages (9 G x tokens / chunk_rows).

    >>> from megatron_zeppelin.planner.testing import toy_context
    >>> from megatron_zeppelin.planner.baselines.static_cp import cp_placement
    >>> ctx = toy_context(nodes=2, gpus=2)
    >>> round(placement_units(cp_placement([4000, 3000, 2000], ctx, 4, Comm.P2P), 4, 2), 2)   # 3 + 4 + 16 + 0.045 x 48
    25.16
    >>> routed = cp_placement([4000, 3000, 2000], ctx, 4, Comm.P2P); routed.routing = True
    >>> round(placement_units(routed, 4, 2), 2), round(placement_units(routed, 4, 2, chunk_rows=1000), 2)  # + 3 x 16; + 0.02 x 9 x 4 x 9
    (57.16, 63.64)
    """
    units = float(len(placement.docs) + world)
    docs: dict = {}
    tokens: dict = {}
    for d in placement.docs:
        if d.ring >= 0:
            docs[d.ring] = docs.get(d.ring, 0) + 1
            tokens[d.ring] = tokens.get(d.ring, 0) + d.length
    for r in placement.rings:
        g = r.size
        n = {Comm.A2A: 2 * g * (g - 1), Comm.ALLGATHER: g * (g - 1)}.get(r.comm, g * g)
        blocks = {Comm.A2A: g, Comm.A2A_P2P: (g // max(r.a2a, 1)) * g}.get(r.comm, g * g)
        spans = r.cls == DocClass.INTER or r.ranks[0] // gpus_per_node != r.ranks[-1] // gpus_per_node
        routed = placement.routing and spans
        units += n * (3 if routed else 1) + BLOCK_UNITS * blocks * docs.get(r.id, 0)
        if routed and chunk_rows:
            units += CHUNK_UNITS * 9 * g * tokens.get(r.id, 0) / chunk_rows
    return units


def chunk_rows_of(ctx) -> float:
    """Token rows of K/V in one relay chunk (build/routing.py relay_chunk_bytes; 0: pieces not cut)."""
    from megatron_zeppelin.planner.build.routing import relay_chunk_bytes
    chunk = relay_chunk_bytes(ctx.cost, ctx.config)
    return chunk / ctx.cost.kv_bytes_per_token if chunk else 0.0


def build_units(docs: int, world: int) -> float:
    """Work units of building one fixed shape's placement (its documents and ranks)."""
    return float(docs + world)
