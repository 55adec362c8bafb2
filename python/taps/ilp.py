"""The strategy-selection ILP of SPEC section 7, built and solved with SCIP through PySCIPOpt.

One binary ``s[v,i]`` per operator and candidate, one choice per operator. Each graph edge gets a
small transportation problem between the layout classes of its two ends: continuous
``f[e,a,b] >= 0`` whose row sums are the producer's choice of output class ``a`` and column sums
the consumer's choice of input class ``b``. For binary ``s`` exactly one ``f`` is 1, so the
objective is exact, and the LP relaxation is far tighter than one binary per strategy pair.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyscipopt import SCIP_PARAMSETTING, Model, quicksum

from taps._core import InfeasibleError, TapsError
from taps.costs import CostTables
from taps.prune import dominance_survivors, negated, restrict, ungroup

#: The largest objective coefficient handed to SCIP: costs are rescaled so that SCIP's absolute
#: tolerances (1e-9) stay far below the smallest cost that matters, whatever the unit.
_OBJECTIVE_SCALE = 1e6


@dataclass(frozen=True)
class IlpOptions:
    """Switches of the ILP; every setting finds the same optimum. The search benchmark
    (``benches/search_stages.py``) shows what each buys."""

    #: "grouped": a continuous flow per pair of layout classes of an edge (SPEC section 7);
    #: "pairwise": the plain Alpa-style formulation, a binary per pair of strategies.
    formulation: str = "grouped"
    #: Drop dominated candidates first (exact, see taps.prune).
    prune: bool = True
    #: SCIP's presolve: off by default, it costs far more than it saves on these models
    #: (AlexNet on 32 devices: 5.8 s with it, 0.13 s without).
    presolve: bool = False
    #: Hand SCIP a first assignment (each operator's cheapest candidate on its own).
    warm_start: bool = True

    def __post_init__(self) -> None:
        if self.formulation not in ("grouped", "pairwise"):
            raise TapsError(
                f"formulation must be 'grouped' or 'pairwise', got {self.formulation!r}"
            )


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


def _scale(tables: CostTables) -> float:
    coeffs = [t.node_cost for t in tables.ops.values()] + [e.cost for e in tables.edges]
    top = max((float(np.abs(c).max()) for c in coeffs if c.size), default=0.0)
    return _OBJECTIVE_SCALE / top if top > 0 else 1.0


def _objective(tables: CostTables, s: dict[str, list], f: list[list[list]], scale: float) -> Any:
    """The scaled cost of the tables over the selection variables ``s`` and edge flows ``f``."""
    terms = []
    for name, t in tables.ops.items():
        terms += [c * scale * x for c, x in zip(t.node_cost.tolist(), s[name]) if c != 0]
    for e, fe in zip(tables.edges, f):
        terms += [c * scale * fe[a][b] for (a, b), c in np.ndenumerate(e.cost) if c != 0]
    return quicksum(terms)


def _check_memory(tables: CostTables, memory_limit: float | None) -> None:
    if memory_limit is None:
        return
    need = smallest_memory(tables)
    if need > memory_limit:
        raise InfeasibleError(
            f"no assignment fits in the memory limit of {memory_limit:,.0f} bytes per device: "
            f"the smallest needs {need:,.0f} bytes for {tables.graph.layers} layer(s)"
        )


def _add_start(
    model: Model,
    tables: CostTables,
    s: dict[str, list],
    f: list[list[list]],
    memory_limit: float | None,
) -> None:
    """Hand SCIP a first assignment, so that a time limit always leaves one to return: every
    operator's cheapest candidate on its own, if it fits the memory limit."""
    choice = {name: int(np.argmin(t.node_cost)) for name, t in tables.ops.items()}
    memory = tables.graph.layers * sum(float(tables.ops[n].memory[i]) for n, i in choice.items())
    if memory_limit is not None and memory > memory_limit:
        return
    sol = model.createSol()
    for name, xs in s.items():
        model.setSolVal(sol, xs[choice[name]], 1.0)
    for e, fe in zip(tables.edges, f):
        a = e.source_class[choice[e.edge.producer]]
        b = e.target_class[choice[e.edge.consumer]]
        model.setSolVal(sol, fe[a][b], 1.0)
    model.addSol(sol)


def solve(
    tables: CostTables,
    memory_limit: float | None = None,
    time_limit: float | None = None,
    options: IlpOptions = IlpOptions(),
    tie_break: tuple[CostTables, str] | None = None,
) -> IlpSolution:
    """Pick one candidate per operator minimising the total cost, under a per-device memory
    limit if given. Raises InfeasibleError if no assignment fits the memory limit. The choice
    indexes the candidates of ``tables`` whatever the options.

    ``tie_break=(other, "min" | "max")`` solves lexicographically: among the assignments optimal
    for ``tables``, the one with the least (or most) cost under ``other``, which must be tables of
    the same graph and cluster under another cost model. Status, gap and time are those of the
    second solve."""
    _check_memory(tables, memory_limit)
    if tie_break is not None and tie_break[1] not in ("min", "max"):
        raise TapsError(f"tie_break sense must be 'min' or 'max', got {tie_break[1]!r}")
    t0 = time.perf_counter()
    keep = {name: np.arange(len(t.strategies)) for name, t in tables.ops.items()}
    if options.prune:
        both = [tables]
        if tie_break is not None:
            other, sense = tie_break
            both.append(other if sense == "min" else negated(other))
        keep = dominance_survivors(both, use_memory=memory_limit is not None)
        tables = restrict(tables, keep)
        if tie_break is not None:
            tie_break = (restrict(tie_break[0], keep), tie_break[1])
    if options.formulation == "pairwise":
        tables = ungroup(tables)
        if tie_break is not None:
            tie_break = (ungroup(tie_break[0]), tie_break[1])
    flow_type = "B" if options.formulation == "pairwise" else "C"
    model = Model("taps")
    model.hideOutput()
    s = {
        name: [model.addVar(vtype="B", name=f"s[{name},{i}]") for i in range(len(t.strategies))]
        for name, t in tables.ops.items()
    }
    constraints = 0
    for name in tables.ops:
        model.addCons(quicksum(s[name]) == 1, name=f"one[{name}]")
        constraints += 1
    f = []
    for k, e in enumerate(tables.edges):
        na, nb = e.cost.shape
        fe = [
            [model.addVar(lb=0.0, vtype=flow_type, name=f"f[{k},{a},{b}]") for b in range(nb)]
            for a in range(na)
        ]
        f.append(fe)
        u, w = s[e.edge.producer], s[e.edge.consumer]
        for a in range(na):
            mine = [u[i] for i in np.flatnonzero(e.source_class == a)]
            model.addCons(quicksum(fe[a]) == quicksum(mine), name=f"out[{k},{a}]")
        for b in range(nb):
            mine = [w[j] for j in np.flatnonzero(e.target_class == b)]
            model.addCons(
                quicksum(fe[a][b] for a in range(na)) == quicksum(mine), name=f"in[{k},{b}]"
            )
        constraints += na + nb
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
    primary = _objective(tables, s, f, _scale(tables))
    model.setObjective(primary, "minimize")
    if time_limit is not None:
        model.setParam("limits/time", float(time_limit))
    if not options.presolve:
        model.setPresolve(SCIP_PARAMSETTING.OFF)
    if options.warm_start:
        _add_start(model, tables, s, f, memory_limit)
    build_time = time.perf_counter() - t0

    model.optimize()
    if tie_break is not None and model.getNSols() > 0:
        other, sense = tie_break
        best = model.getObjVal()
        model.freeTransform()
        # Optimal for the first objective up to float noise in the scaled units.
        model.addCons(primary <= best + 1e-9 * abs(best) + 1e-6, name="optimal")
        constraints += 1
        model.setObjective(
            _objective(other, s, f, _scale(other)), "minimize" if sense == "min" else "maximize"
        )
        model.optimize()
    status = model.getStatus()
    if model.getNSols() == 0:
        if status == "infeasible":
            raise InfeasibleError("no assignment satisfies the constraints")
        raise TapsError(f"SCIP stopped ({status}) before finding any assignment")
    sol = model.getBestSol()
    choice = {
        name: int(keep[name][np.argmax([model.getSolVal(sol, x) for x in xs])])
        for name, xs in s.items()
    }
    flows = sum(len(fe) * len(fe[0]) for fe in f if fe)
    binaries = sum(len(x) for x in s.values())
    size = (
        IlpSize(binaries + flows, 0, constraints)
        if flow_type == "B"
        else IlpSize(binaries, flows, constraints)
    )
    # SCIP says 1e20 when it has no dual bound yet.
    gap = float(model.getGap())
    return IlpSolution(
        choice,
        status,
        math.inf if gap >= 1e20 else gap,
        float(model.getSolvingTime()),
        build_time,
        size,
    )
