"""The strategy-selection ILP of SPEC section 7, built and solved with SCIP through PySCIPOpt.

One binary ``s[v,i]`` per operator and candidate, one choice per operator. Each graph edge gets a
small transportation problem between the layout classes of its two ends: continuous
``f[e,a,b] >= 0`` whose row sums are the producer's choice of output class ``a`` and column sums
the consumer's choice of input class ``b``. For binary ``s`` exactly one ``f`` is 1, so the
objective is exact, and the LP relaxation is far tighter than one binary per strategy pair.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from pyscipopt import Model, quicksum

from taps._core import InfeasibleError, TapsError
from taps.costs import CostTables

#: The largest objective coefficient handed to SCIP: costs are rescaled so that SCIP's absolute
#: tolerances (1e-9) stay far below the smallest cost that matters, whatever the unit.
_OBJECTIVE_SCALE = 1e6


@dataclass(frozen=True)
class IlpSize:
    """What SCIP was handed."""

    binaries: int
    continuous: int
    constraints: int

    @property
    def variables(self) -> int:
        return self.binaries + self.continuous


@dataclass(frozen=True)
class IlpSolution:
    choice: dict[str, int]
    status: str
    gap: float
    solve_time: float
    build_time: float
    size: IlpSize


def smallest_memory(tables: CostTables) -> float:
    """The least memory per device any assignment needs (memory adds up per operator)."""
    per_layer = sum(float(t.memory.min()) for t in tables.ops.values())
    return per_layer * tables.graph.layers


def solve(
    tables: CostTables, memory_limit: float | None = None, time_limit: float | None = None
) -> IlpSolution:
    """Pick one candidate per operator minimising the total cost, under a per-device memory
    limit if given. Raises InfeasibleError if no assignment fits the memory limit."""
    if memory_limit is not None:
        need = smallest_memory(tables)
        if need > memory_limit:
            raise InfeasibleError(
                f"no assignment fits in the memory limit of {memory_limit:,.0f} bytes per device: "
                f"the smallest needs {need:,.0f} bytes for {tables.graph.layers} layer(s)"
            )
    t0 = time.perf_counter()
    coeffs = [t.node_cost for t in tables.ops.values()] + [e.cost for e in tables.edges]
    top = max((float(np.abs(c).max()) for c in coeffs if c.size), default=0.0)
    scale = _OBJECTIVE_SCALE / top if top > 0 else 1.0

    model = Model("taps")
    model.hideOutput()
    s = {
        name: [model.addVar(vtype="B", name=f"s[{name},{i}]") for i in range(len(t.strategies))]
        for name, t in tables.ops.items()
    }
    objective = []
    constraints = 0
    for name, t in tables.ops.items():
        model.addCons(quicksum(s[name]) == 1, name=f"one[{name}]")
        constraints += 1
        objective += [c * scale * x for c, x in zip(t.node_cost.tolist(), s[name]) if c != 0]
    continuous = 0
    for k, e in enumerate(tables.edges):
        na, nb = e.cost.shape
        f = [[model.addVar(lb=0.0, name=f"f[{k},{a},{b}]") for b in range(nb)] for a in range(na)]
        continuous += na * nb
        u, w = s[e.edge.producer], s[e.edge.consumer]
        for a in range(na):
            mine = [u[i] for i in np.flatnonzero(e.source_class == a)]
            model.addCons(quicksum(f[a]) == quicksum(mine), name=f"out[{k},{a}]")
        for b in range(nb):
            mine = [w[j] for j in np.flatnonzero(e.target_class == b)]
            model.addCons(
                quicksum(f[a][b] for a in range(na)) == quicksum(mine), name=f"in[{k},{b}]"
            )
        constraints += na + nb
        objective += [c * scale * f[a][b] for (a, b), c in np.ndenumerate(e.cost) if c != 0]
    if memory_limit is not None:
        layers = tables.graph.layers
        model.addCons(
            quicksum(
                m * layers * x
                for t in tables.ops.values()
                for m, x in zip(t.memory.tolist(), s[t.op.name])
            )
            <= memory_limit,
            name="memory",
        )
        constraints += 1
    model.setObjective(quicksum(objective), "minimize")
    if time_limit is not None:
        model.setParam("limits/time", float(time_limit))
    build_time = time.perf_counter() - t0

    model.optimize()
    status = model.getStatus()
    if model.getNSols() == 0:
        if status == "infeasible":
            raise InfeasibleError("no assignment satisfies the constraints")
        raise TapsError(f"SCIP stopped ({status}) before finding any assignment")
    best = model.getBestSol()
    choice = {
        name: int(np.argmax([model.getSolVal(best, x) for x in xs])) for name, xs in s.items()
    }
    size = IlpSize(sum(len(x) for x in s.values()), continuous, constraints)
    return IlpSolution(
        choice, status, float(model.getGap()), float(model.getSolvingTime()), build_time, size
    )
