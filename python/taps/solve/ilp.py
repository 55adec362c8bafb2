"""The strategy-selection ILP (docs/conventions.md#the-ilp), built and solved with SCIP through
PySCIPOpt: the last stage of :func:`taps.solve.solve`.

One binary ``s[v,i]`` per operator and candidate, one choice per operator. Each graph edge gets a
small transportation problem between the layout classes of its two ends: continuous
``f[e,a,b] >= 0`` whose row sums are the producer's choice of output class ``a`` and column sums
the consumer's choice of input class ``b``. For binary ``s`` exactly one ``f`` is 1, so the
objective is exact, and the LP relaxation is far tighter than one binary per strategy pair.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from pyscipopt import SCIP_PARAMSETTING, Model, quicksum

from taps._support.deadline import check
from taps._support.limits import check_ilp_memory
from taps.errors import InfeasibleError, TapsError
from taps.solve.problem import IlpOptions, IlpSize, IlpSolution, MemoryLimit, PairCost, Problem

#: The largest objective coefficient handed to SCIP: costs are rescaled so that SCIP's absolute
#: tolerances (1e-9) stay far below the smallest cost that matters, whatever the unit.
_OBJECTIVE_SCALE = 1e6
#: How far SCIP may exceed the memory limit, relative to it.
MEMORY_FEASTOL = 1e-9


def _ungrouped(problem: Problem) -> Problem:
    """Every candidate its own class: the pairwise (Alpa-style) view of the pair costs."""
    pairs = [
        PairCost(
            p.u,
            p.w,
            np.arange(len(p.u_class)),
            np.arange(len(p.w_class)),
            p.cost[np.ix_(p.u_class, p.w_class)],
        )
        for p in problem.pairs
    ]
    return Problem(problem.node_cost, pairs)


def _scale(problem: Problem) -> float:
    coeffs = [*problem.node_cost.values(), *(p.cost for p in problem.pairs)]
    top = max((float(np.abs(c).max()) for c in coeffs if c.size), default=0.0)
    return _OBJECTIVE_SCALE / top if top > 0 else 1.0


def _coefficients(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """The scaled objective of ``problem`` on the selection variables (operators in order, their
    candidates in order) and on the flows (pairs in order, each cost matrix row by row)."""
    scale = _scale(problem)
    node = list(problem.node_cost.values())
    flows = [p.cost.ravel() for p in problem.pairs]
    return (
        np.concatenate(node) * scale if node else np.zeros(0),
        np.concatenate(flows) * scale if flows else np.zeros(0),
    )


@dataclass
class _Model:
    """A built SCIP model: the selection variables of all operators in one vector (operator
    ``v``'s at ``span[v]``) and the flows of all pair costs in another (pair ``k``'s from
    ``offset[k]``, its cost matrix row by row)."""

    model: Model
    s: Any
    span: dict[str, slice]
    f: Any
    offset: list[int]
    size: IlpSize

    def flow(self, problem: Problem, k: int, a: int, b: int) -> Any:
        return self.f[self.offset[k] + a * problem.pairs[k].cost.shape[1] + b]

    def objective(self, problem: Problem) -> Any:
        """The scaled cost of ``problem`` (same operators and classes) over the variables."""
        return quicksum(_weighted(x, c) for x, c in zip((self.s, self.f), _coefficients(problem)))

    def choice(self) -> dict[str, int]:
        sol = self.model.getBestSol()
        return {
            name: int(np.argmax([self.model.getSolVal(sol, x) for x in self.s[span]]))
            for name, span in self.span.items()
        }


def _weighted(variables: Any, coefficients: np.ndarray) -> Any:
    """The sum of the variables times their coefficients, the zeros left out."""
    (nonzero,) = np.nonzero(coefficients)
    return quicksum(variables[nonzero] * coefficients[nonzero])


def _by_class(variables: Any, cls: np.ndarray, count: int) -> list[Any]:
    """The variables of each class ``0 .. count - 1``, in their order: one sort, not a mask per
    class (quadratic in the candidates of an operator with thousands of classes)."""
    order = np.argsort(cls, kind="stable")
    bounds = np.searchsorted(cls[order], np.arange(count + 1))
    return [variables[order[lo:hi]] for lo, hi in itertools.pairwise(bounds)]


def _build(
    problem: Problem, binary_flows: bool, memory: MemoryLimit | None, deadline: float | None
) -> _Model:
    """The ILP in bulk: one vector of selection variables, then each pair cost's flows, each
    created by one call with its objective coefficients (the first objective of the solve), and
    the constraints built and added a pair cost at a time. Past ``deadline`` (checked before
    each pair cost's flows and constraints), :class:`taps.errors.TimeLimitError`."""
    model = Model("taps")
    model.hideOutput()
    node, flow = _coefficients(problem)
    s = model.addMatrixVar((len(node),), vtype="B", obj=node)
    offset = np.cumsum([0, *(p.cost.size for p in problem.pairs)]).tolist()
    flows = []
    for at, end in itertools.pairwise(offset):
        check(deadline, "building the ILP")
        vtype = "B" if binary_flows else "C"
        flows.append(model.addMatrixVar((end - at,), vtype=vtype, lb=0.0, obj=flow[at:end]))
    f = np.concatenate(flows) if flows else np.zeros(0, dtype=object)
    ends = np.cumsum([len(c) for c in problem.node_cost.values()]).tolist()
    span = {n: slice(end - len(c), end) for (n, c), end in zip(problem.node_cost.items(), ends)}
    conss = [quicksum(s[span[n]]) == 1 for n in problem.node_cost]
    model.addConss(conss)
    count = len(conss)
    for p, fk in zip(problem.pairs, flows):
        check(deadline, "building the ILP")
        na, nb = p.cost.shape
        fp = fk.reshape(na, nb)
        u = _by_class(s[span[p.u]], p.u_class, na)
        w = _by_class(s[span[p.w]], p.w_class, nb)
        conss = [quicksum(fp[a]) == quicksum(u[a]) for a in range(na)]
        conss += [quicksum(fp[:, b]) == quicksum(w[b]) for b in range(nb)]
        model.addConss(conss)
        count += len(conss)
    conss = []
    if memory is not None:
        # In units of the limit: coefficients near 1, not 1e9 bytes, keep the LP well conditioned
        # (in bytes SCIP has pruned the optimum as infeasible). SCIP takes a row as satisfied up
        # to its feasibility tolerance: 1e-9 of the limit (4 bytes in 4 GB), not the default 1e-6.
        scale = memory.layers / memory.limit
        model.setParam("numerics/feastol", MEMORY_FEASTOL)
        mem = np.concatenate([memory.per_op[name] for name in problem.node_cost]) * scale
        conss.append(_weighted(s, mem) <= 1.0)
    model.addConss(conss)
    size = IlpSize(
        len(node) + len(flow) if binary_flows else len(node),
        0 if binary_flows else len(flow),
        count + len(conss),
        len(span),
    )
    return _Model(model, s, span, f, offset[:-1], size)


def _add_start(
    built: _Model, problem: Problem, memory: MemoryLimit | None, start: dict[str, int] | None
) -> None:
    """Hand SCIP a first assignment, so that a time limit always leaves one to return: ``start``
    if given, else every operator's cheapest candidate on its own, if it fits the memory limit."""
    choice = start or {name: int(np.argmin(cost)) for name, cost in problem.node_cost.items()}
    if memory is not None and memory.of(choice) > memory.limit * (1 + MEMORY_FEASTOL):
        return
    model = built.model
    sol = model.createSol()
    for name, span in built.span.items():
        model.setSolVal(sol, built.s[span][choice[name]], 1.0)
    for k, p in enumerate(problem.pairs):
        a, b = p.u_class[choice[p.u]], p.w_class[choice[p.w]]
        model.setSolVal(sol, built.flow(problem, k, a, b), 1.0)
    model.addSol(sol)


def _optimize(model: Model) -> None:
    """``model.optimize()`` that Ctrl-C stops at once: SCIP solves in a thread without the GIL
    while this one waits, so the KeyboardInterrupt is raised here, and it interrupts SCIP. (SCIP's
    own Ctrl-C handler would end the solve as if it were done, and print a line of its own.)"""
    model.setParam("misc/catchctrlc", False)
    failure: list[BaseException] = []

    def solve() -> None:
        try:
            model.optimizeNogil()
        except BaseException as e:  # re-raised in the caller's thread
            failure.append(e)

    worker = threading.Thread(target=solve, name="taps-scip")
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.05)
    except BaseException:
        # SCIP takes an interrupt only while it solves: before that (setting up, presolving) or
        # after it, it refuses; try again until the worker is done.
        while worker.is_alive():
            try:
                model.interruptSolve()
            except Exception:
                worker.join(0.01)
            else:
                worker.join()
        raise
    if failure:
        raise failure[0]


def solve_ilp(
    objectives: list[Problem],
    options: IlpOptions,
    memory: MemoryLimit | None,
    deadline: float | None,
    start: dict[str, int] | None = None,
) -> IlpSolution:
    """Build and solve the ILP of the first objective, then, if there is a second, minimise it
    among the optima of the first (a lexicographic solve). SCIP stops at ``deadline`` (a
    ``time.perf_counter()`` value) with its best assignment so far. An ILP whose estimated
    memory exceeds what this process may use is a :class:`taps.errors.ResourceError`."""
    t0 = time.perf_counter()
    if options.formulation == "pairwise":
        objectives = [_ungrouped(o) for o in objectives]
    problem = objectives[0]
    # Its size is known before SCIP holds any of it: refused up front rather than failing in
    # SCIP ("insufficient memory") after a long build.
    check_ilp_memory(
        sum(len(c) for c in problem.node_cost.values()) + sum(p.cost.size for p in problem.pairs),
        len(problem.node_cost) + sum(sum(p.cost.shape) for p in problem.pairs) + 1,
    )
    built = _build(problem, options.formulation == "pairwise", memory, deadline)
    model = built.model
    if deadline is not None:
        model.setParam("limits/time", max(deadline - time.perf_counter(), 0.0))
    if not options.presolve:
        model.setPresolve(SCIP_PARAMSETTING.OFF)
    if options.warm_start:
        _add_start(built, problem, memory, start)
    build_time = time.perf_counter() - t0
    _optimize(model)
    size = built.size
    if len(objectives) > 1 and model.getNSols() > 0:
        best = model.getObjVal()
        model.freeTransform()
        # Optimal for the first objective up to float noise in the scaled units.
        primary = built.objective(problem)
        model.addCons(primary <= best + 1e-9 * abs(best) + 1e-6, name="optimal")
        size = replace(size, constraints=size.constraints + 1)
        model.setObjective(built.objective(objectives[1]), "minimize")
        _optimize(model)
    status = model.getStatus()
    if model.getNSols() == 0:
        if status == "infeasible":
            raise InfeasibleError("no assignment satisfies the constraints")
        raise TapsError(f"SCIP stopped ({status}) before finding any assignment")
    # SCIP says 1e20 when it has no dual bound yet.
    gap = float(model.getGap())
    return IlpSolution(
        built.choice(),
        status,
        math.inf if gap >= 1e20 else gap,
        float(model.getSolvingTime()),
        build_time,
        0.0,
        size,
    )
