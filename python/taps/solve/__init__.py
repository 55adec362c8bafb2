"""Deciding one candidate per operator: the problem data model (:mod:`.problem`), the exact
reductions, variable elimination, dominance pruning, tied repeats, the memory price and the SCIP
model, run in order by :func:`solve` (:mod:`.pipeline` maps each stage to its module).

Nothing here knows graphs, layouts or clusters: a problem is node costs and pair costs over
candidates, and memory per candidate. :mod:`taps.search` builds it from a graph.
"""

from taps.solve.pipeline import smallest_memory, solve
from taps.solve.problem import IlpOptions, IlpSize, IlpSolution, Instance, PairCost, Problem

__all__ = [
    "IlpOptions",
    "IlpSize",
    "IlpSolution",
    "Instance",
    "PairCost",
    "Problem",
    "smallest_memory",
    "solve",
]
