"""Exact pruning of the search space: drop every candidate that another candidate of the same
operator dominates (no more node cost, no more memory when memory is limited, and no more
redistribution cost towards every remaining candidate of every neighbour, under every cost table
given). Any assignment that uses a dominated candidate can switch to its dominator without costing
more, so the optimum is unchanged. Pruning an operator shrinks its neighbours' profiles, so it
repeats to a fixpoint."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from taps.costs import CostTables, EdgeTable, OpTable


def _dominated(profile: np.ndarray) -> np.ndarray:
    """Rows dominated by another row (no entry larger); of equal rows the first survives."""
    keep = np.ones(len(profile), dtype=bool)
    for i in range(len(profile)):
        if keep[i]:
            worse = np.all(profile[i] <= profile, axis=1)
            # An equal row earlier in the list is the survivor, not a victim.
            worse[: i + 1] = False
            keep &= ~worse
    return ~keep


def negated(tables: CostTables) -> CostTables:
    """The tables with every cost negated: what dominance must see of an objective maximised."""
    ops = {n: replace(t, node_cost=-t.node_cost) for n, t in tables.ops.items()}
    return replace(tables, ops=ops, edges=[replace(e, cost=-e.cost) for e in tables.edges])


def dominance_survivors(tables: Sequence[CostTables], use_memory: bool) -> dict[str, np.ndarray]:
    """Per operator, the candidate indices no other candidate dominates in all of ``tables``
    (tables of one graph and cluster to be minimised, e.g. both objectives of a lexicographic
    solve; pass :func:`negated` tables for an objective that is maximised)."""
    first = tables[0]
    alive = {name: np.ones(len(t.strategies), dtype=bool) for name, t in first.ops.items()}
    changed = True
    while changed:
        changed = False
        for name, t in first.ops.items():
            idx = np.flatnonzero(alive[name])
            parts = [t.memory[idx, None]] if use_memory else []
            for tab in tables:
                parts.append(tab.ops[name].node_cost[idx, None])
                for e in tab.edges:
                    if e.edge.producer == name:
                        cols = np.unique(e.target_class[alive[e.edge.consumer]])
                        parts.append(e.cost[np.ix_(e.source_class[idx], cols)])
                    if e.edge.consumer == name:
                        rows = np.unique(e.source_class[alive[e.edge.producer]])
                        parts.append(e.cost[np.ix_(rows, e.target_class[idx])].T)
            dead = _dominated(np.hstack(parts))
            if dead.any():
                alive[name][idx[dead]] = False
                changed = True
    return {name: np.flatnonzero(a) for name, a in alive.items()}


def restrict(tables: CostTables, keep: dict[str, np.ndarray]) -> CostTables:
    """The tables with only the candidates ``keep`` (indices per operator), and only the layout
    classes those candidates use."""
    ops = {
        name: OpTable(
            t.op,
            [t.strategies[i] for i in keep[name]],
            t.node_cost[keep[name]],
            t.memory[keep[name]],
        )
        for name, t in tables.ops.items()
    }
    edges = []
    for e in tables.edges:
        rows, src = np.unique(e.source_class[keep[e.edge.producer]], return_inverse=True)
        cols, dst = np.unique(e.target_class[keep[e.edge.consumer]], return_inverse=True)
        edges.append(EdgeTable(e.edge, src, dst, e.cost[np.ix_(rows, cols)]))
    return replace(tables, ops=ops, edges=edges)


def ungroup(tables: CostTables) -> CostTables:
    """Every candidate its own layout class: the pairwise (Alpa-style) view of the edges."""
    edges = [
        EdgeTable(
            e.edge,
            np.arange(len(e.source_class)),
            np.arange(len(e.target_class)),
            e.cost[np.ix_(e.source_class, e.target_class)],
        )
        for e in tables.edges
    ]
    return replace(tables, edges=edges)
