"""The strategy-selection ILP (docs/conventions.md#the-ilp), built and solved with SCIP through
PySCIPOpt.

One binary ``s[v,i]`` per operator and candidate, one choice per operator. Each graph edge gets a
small transportation problem between the layout classes of its two ends: continuous
``f[e,a,b] >= 0`` whose row sums are the producer's choice of output class ``a`` and column sums
the consumer's choice of input class ``b``. For binary ``s`` exactly one ``f`` is 1, so the
objective is exact, and the LP relaxation is far tighter than one binary per strategy pair.

Before SCIP, the exact reductions of :mod:`taps.reductions` eliminate what dynamic programming can
(chains, trees, series-parallel blocks such as residual connections); what they leave is solved by
variable elimination (:mod:`taps.elimination`) when its tables are small enough, and otherwise its
dominated candidates are pruned (:mod:`taps.prune`) and SCIP gets the core.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from pyscipopt import SCIP_PARAMSETTING, Model, quicksum

from taps._core import InfeasibleError, TapsError
from taps.costs import CostTables
from taps.elimination import MAX_WORK, plan
from taps.lagrange import price_memory, prune_by_price
from taps.prune import dominance_survivors, negated, restrict
from taps.reductions import PairCost, Problem, Reduction, reduce
from taps.tying import Ties

#: The largest objective coefficient handed to SCIP: costs are rescaled so that SCIP's absolute
#: tolerances (1e-9) stay far below the smallest cost that matters, whatever the unit.
_OBJECTIVE_SCALE = 1e6
#: Variable elimination is tried when its estimated work (additions) is below this many per flow
#: variable the core's ILP would have: numpy adds about 1e8 a second, SCIP builds and solves
#: about 2e4 flows a second (a skip ladder of 500 operators on 64 devices: 55,000 flows, 4 s in
#: SCIP, 0.8 s eliminated; a dense block of 7 layers on 32 devices: 0.27 s in SCIP, 0.58 s
#: eliminated).
_WORK_PER_FLOW = 5_000
#: How far SCIP may exceed the memory limit, relative to it.
_MEMORY_FEASTOL = 1e-9


@dataclass(frozen=True)
class IlpOptions:
    """Switches of the ILP; every setting finds the same optimum. The search benchmark
    (``benches/search_stages.py``) shows what each buys."""

    #: "grouped": a continuous flow per pair of layout classes of an edge (conventions.md#the-ilp);
    #: "pairwise": the plain Alpa-style formulation, a binary per pair of strategies.
    formulation: str = "grouped"
    #: Drop dominated candidates first (exact, see taps.prune).
    prune: bool = True
    #: SCIP's presolve: off by default, it costs far more than it saves on these models
    #: (AlexNet on 32 devices: 5.8 s with it, 0.13 s without).
    presolve: bool = False
    #: Hand SCIP a first assignment (each operator's cheapest candidate on its own).
    warm_start: bool = True
    #: Eliminate operators exactly before SCIP (taps.reductions): fixed, leaf and series
    #: operators, parallel edges merged; SCIP solves the core left, and is not called when nothing
    #: joins the operators left. Under a binding memory limit only operators whose memory does
    #: not depend on their candidate go.
    reduce: bool = True
    #: Solve the core the reductions leave (a graph that is not series-parallel) by exact
    #: variable elimination (taps.elimination) when its tables fit a budget, without SCIP.
    #: Single objective without a binding memory limit only. Needs ``reduce``.
    eliminate: bool = True
    #: Under a binding memory limit, price memory (taps.lagrange) before SCIP: series-parallel
    #: problems are decided by the reductions when the price closes the gap, otherwise it prunes
    #: candidates exactly and gives SCIP its first assignment. Needs ``reduce``.
    price: bool = True

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
    #: Operators in the ILP, and operators decided before it (taps.reductions).
    operators: int
    eliminated: int = 0

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
    reduce_time: float
    size: IlpSize


def smallest_memory(tables: CostTables) -> float:
    """The least memory per device any assignment needs (memory adds up per operator)."""
    per_layer = sum(float(t.memory.min()) for t in tables.ops.values())
    return per_layer * tables.graph.layers


def _check_memory(tables: CostTables, memory_limit: float | None) -> None:
    if memory_limit is None:
        return
    need = smallest_memory(tables)
    if need > memory_limit:
        raise InfeasibleError(
            f"no assignment fits in the memory limit of {memory_limit:,.0f} bytes per device: "
            f"the smallest needs {need:,.0f} bytes for {tables.graph.layers} layer(s)"
        )


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


def _build(problem: Problem, binary_flows: bool, memory: _Memory | None) -> _Model:
    """The ILP in bulk: one vector of selection variables and one of flows, each created by one
    call with its objective coefficients (the first objective of the solve), and the constraints
    built as one list and added by one call."""
    model = Model("taps")
    model.hideOutput()
    node, flow = _coefficients(problem)
    s = model.addMatrixVar((len(node),), vtype="B", obj=node)
    f = model.addMatrixVar((len(flow),), vtype="B" if binary_flows else "C", lb=0.0, obj=flow)
    ends = np.cumsum([len(c) for c in problem.node_cost.values()]).tolist()
    span = {n: slice(end - len(c), end) for (n, c), end in zip(problem.node_cost.items(), ends)}
    offset = np.cumsum([0, *(p.cost.size for p in problem.pairs)]).tolist()
    conss = [quicksum(s[span[n]]) == 1 for n in problem.node_cost]
    for p, at in zip(problem.pairs, offset):
        na, nb = p.cost.shape
        fp = f[at : at + na * nb].reshape(na, nb)
        u, w = s[span[p.u]], s[span[p.w]]
        conss += [quicksum(fp[a]) == quicksum(u[p.u_class == a]) for a in range(na)]
        conss += [quicksum(fp[:, b]) == quicksum(w[p.w_class == b]) for b in range(nb)]
    if memory is not None:
        # In units of the limit: coefficients near 1, not 1e9 bytes, keep the LP well conditioned
        # (in bytes SCIP has pruned the optimum as infeasible). SCIP takes a row as satisfied up
        # to its feasibility tolerance: 1e-9 of the limit (4 bytes in 4 GB), not the default 1e-6.
        scale = memory.layers / memory.limit
        model.setParam("numerics/feastol", _MEMORY_FEASTOL)
        mem = np.concatenate([memory.per_op[name] for name in problem.node_cost]) * scale
        conss.append(_weighted(s, mem) <= 1.0)
    model.addConss(conss)
    size = IlpSize(
        len(node) + len(flow) if binary_flows else len(node),
        0 if binary_flows else len(flow),
        len(conss),
        len(span),
    )
    return _Model(model, s, span, f, offset[:-1], size)


@dataclass(frozen=True)
class _Memory:
    per_op: dict[str, np.ndarray]
    layers: int
    limit: float

    def of(self, choice: dict[str, int]) -> float:
        return self.layers * sum(float(self.per_op[n][i]) for n, i in choice.items())


def _add_start(
    built: _Model, problem: Problem, memory: _Memory | None, start: dict[str, int] | None
) -> None:
    """Hand SCIP a first assignment, so that a time limit always leaves one to return: ``start``
    if given, else every operator's cheapest candidate on its own, if it fits the memory limit."""
    choice = start or {name: int(np.argmin(cost)) for name, cost in problem.node_cost.items()}
    if memory is not None and memory.of(choice) > memory.limit * (1 + _MEMORY_FEASTOL):
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


def _run(
    objectives: list[Problem],
    options: IlpOptions,
    memory: _Memory | None,
    deadline: float | None,
    start: dict[str, int] | None = None,
) -> IlpSolution:
    """Build and solve the ILP of the first objective, then, if there is a second, minimise it
    among the optima of the first (a lexicographic solve). SCIP stops at ``deadline`` (a
    ``time.perf_counter()`` value) with its best assignment so far."""
    t0 = time.perf_counter()
    if options.formulation == "pairwise":
        objectives = [_ungrouped(o) for o in objectives]
    problem = objectives[0]
    built = _build(problem, options.formulation == "pairwise", memory)
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


def solve(
    tables: CostTables,
    memory_limit: float | None = None,
    time_limit: float | None = None,
    options: IlpOptions = IlpOptions(),
    tie_break: tuple[CostTables, str] | None = None,
    tie: bool = True,
) -> IlpSolution:
    """Pick one candidate per operator minimising the total cost, under a per-device memory
    limit if given. Raises InfeasibleError if no assignment fits the memory limit. The choice
    indexes the candidates of ``tables`` whatever the options. ``time_limit`` (seconds) bounds
    the whole call: every SCIP solve in it gets what is left.

    ``tie_break=(other, "min" | "max")`` solves lexicographically: among the assignments optimal
    for ``tables``, the one with the least (or most) cost under ``other``, which must be tables of
    the same graph and cluster under another cost model. Status, gap and time are those of the
    second solve.

    With ``tie`` (the default) the graph's tied repeats (:meth:`taps.Graph.tie`) take one set of
    choices (:mod:`taps.tying`); ``tie=False`` searches every operator on its own."""
    deadline = None if time_limit is None else time.perf_counter() + time_limit
    _check_memory(tables, memory_limit)
    if tie_break is not None and tie_break[1] not in ("min", "max"):
        raise TapsError(f"tie_break sense must be 'min' or 'max', got {tie_break[1]!r}")
    objectives = [tables.problem()]
    if tie_break is not None:
        other = tie_break[0].problem()
        # Minimised from here on: the most of the other cost is the least of its negation.
        objectives.append(other if tie_break[1] == "min" else negated(other))
    per_op = {n: t.memory for n, t in tables.ops.items()}
    ties = Ties.of(list(tables.ops), tables.graph.tied) if tie and tables.graph.tied else None
    if ties is not None:
        objectives = ties.fold(objectives)
        per_op = ties.fold_memory(per_op)
    memory = None if memory_limit is None else _Memory(per_op, tables.graph.layers, memory_limit)
    solution = _solve(objectives, memory, options, deadline)
    if ties is not None:
        solution = replace(solution, choice=ties.expand(solution.choice))
    return solution


def _solve(
    objectives: list[Problem],
    memory: _Memory | None,
    options: IlpOptions,
    deadline: float | None,
) -> IlpSolution:
    if not options.reduce:
        return _pruned_run(objectives, options, memory, deadline)
    order = list(objectives[0].node_cost)
    if memory is None:
        return _reduced(objectives, order, None, options, deadline)
    # Operators whose memory is the same whatever their candidate (elementwise ones, whose every
    # split shards the output evenly) can go exactly under any limit: reduced once, for both the
    # optimum without the limit and the search under it.
    steady = {v for v, m in memory.per_op.items() if np.ptp(m) == 0}
    t0 = time.perf_counter()
    pre = reduce(objectives, order, steady)
    pre_time = time.perf_counter() - t0
    free = _reduced(pre.cores, list(pre.cores[0].node_cost), None, options, deadline)
    choice = pre.expand(free.choice)
    # The optimum without the memory limit is optimal with it if it fits.
    if memory.of(choice) <= memory.limit:
        size = replace(free.size, eliminated=free.size.eliminated + pre.eliminated)
        return replace(free, choice=choice, reduce_time=free.reduce_time + pre_time, size=size)
    again = _reduced(objectives, order, memory, options, deadline, steady, pre)
    return replace(again, reduce_time=again.reduce_time + free.reduce_time + pre_time)


def _reduced(
    objectives: list[Problem],
    order: list[str],
    memory: _Memory | None,
    options: IlpOptions,
    deadline: float | None,
    eliminable: set[str] | None = None,
    reduction: Reduction | None = None,
) -> IlpSolution:
    """Solve after the exact reductions (of the ``eliminable`` operators only, if given, which
    must have the same memory for every candidate when ``memory`` is given; ``reduction`` if
    they were already run)."""
    t0 = time.perf_counter()
    if reduction is None:
        reduction = reduce(objectives, order, eliminable)
    reduce_time = time.perf_counter() - t0
    core = reduction.cores[0]
    if memory is not None:
        gone = [v for v in memory.per_op if v not in core.node_cost]
        fixed = memory.layers * sum(float(memory.per_op[v][0]) for v in gone)
        memory = _Memory(
            {v: memory.per_op[v] for v in core.node_cost}, memory.layers, memory.limit - fixed
        )
        run = _limited(reduction.cores, memory, options, deadline)
        eliminated = reduction.eliminated + run.size.eliminated
    elif core.pairs:
        run = _eliminated(reduction.cores, options, deadline) or _pruned_run(
            reduction.cores, options, memory, deadline
        )
        eliminated = reduction.eliminated + run.size.eliminated
    else:
        # Nothing joins the operators left: each takes its cheapest candidate, no SCIP needed.
        choice = reduction.isolated_choice()
        run = IlpSolution(choice, "optimal", 0.0, 0.0, 0.0, 0.0, IlpSize(0, 0, 0, 0))
        eliminated = len(core.node_cost) + reduction.eliminated
    t1 = time.perf_counter()
    choice = reduction.expand(run.choice)
    reduce_time += time.perf_counter() - t1
    return replace(
        run,
        choice=choice,
        reduce_time=run.reduce_time + reduce_time,
        size=replace(run.size, eliminated=eliminated),
    )


def _eliminated(
    objectives: list[Problem], options: IlpOptions, deadline: float | None
) -> IlpSolution | None:
    """The core solved by variable elimination, if it is on, there is one objective and the
    elimination fits its budget and the deadline; ``size.eliminated`` counts its operators."""
    if not options.eliminate or len(objectives) > 1:
        return None
    t0 = time.perf_counter()
    flows = sum(p.cost.size for p in objectives[0].pairs)
    elimination = plan(objectives[0], max_work=min(MAX_WORK, _WORK_PER_FLOW * flows))
    solved = None if elimination is None else elimination.solve(deadline)
    if solved is None:
        return None
    size = IlpSize(0, 0, 0, 0, eliminated=len(objectives[0].node_cost))
    return IlpSolution(solved[0], "optimal", 0.0, 0.0, 0.0, time.perf_counter() - t0, size)


def _limited(
    objectives: list[Problem],
    memory: _Memory,
    options: IlpOptions,
    deadline: float | None,
) -> IlpSolution:
    """The core left by the reductions, under the memory limit: priced first (taps.lagrange),
    which decides it when the price closes the gap and otherwise prunes it exactly and gives SCIP
    its first assignment. ``size.eliminated`` counts the operators the price decided."""
    if len(objectives) > 1 or not options.price:
        return _pruned_run(objectives, options, memory, deadline)
    t0 = time.perf_counter()
    problem = objectives[0]
    scaled = {v: m * memory.layers for v, m in memory.per_op.items()}
    priced = price_memory(problem, scaled, memory.limit)
    if priced is None or priced.choice is None:
        run = _pruned_run(objectives, options, memory, deadline)
        return replace(run, reduce_time=time.perf_counter() - t0)
    if priced.optimal:
        size = IlpSize(0, 0, 0, 0, eliminated=len(problem.node_cost))
        return IlpSolution(priced.choice, "optimal", 0.0, 0.0, 0.0, time.perf_counter() - t0, size)
    # The price's best assignment is the one to beat: candidates that cannot are dropped.
    keep = prune_by_price(problem, scaled, memory.limit, priced.price, priced.cost)
    restricted, kept_memory, start = _restricted(objectives, memory, keep, priced.choice)
    price_time = time.perf_counter() - t0
    run = _pruned_run(restricted, options, kept_memory, deadline, start)
    return replace(run, choice=_lifted(run.choice, keep), reduce_time=price_time)


def _restricted(
    objectives: list[Problem],
    memory: _Memory | None,
    keep: dict[str, np.ndarray],
    start: dict[str, int] | None,
) -> tuple[list[Problem], _Memory | None, dict[str, int] | None]:
    """The problems, memory and first assignment on the candidates ``keep`` (sorted indices per
    operator, which hold ``start``'s)."""
    if memory is not None:
        memory = replace(memory, per_op={v: m[keep[v]] for v, m in memory.per_op.items()})
    if start is not None:
        start = {v: int(np.searchsorted(keep[v], i)) for v, i in start.items()}
    return [restrict(o, keep) for o in objectives], memory, start


def _lifted(choice: dict[str, int], keep: dict[str, np.ndarray]) -> dict[str, int]:
    """A choice among the candidates ``keep`` as indices of all the candidates."""
    return {v: int(keep[v][i]) for v, i in choice.items()}


def _pruned_run(
    objectives: list[Problem],
    options: IlpOptions,
    memory: _Memory | None,
    deadline: float | None,
    start: dict[str, int] | None = None,
) -> IlpSolution:
    """:func:`_run` of the objectives (one, or two to minimise lexicographically) on the
    candidates that survive pruning (if on); the choice indexes the candidates of the problems,
    and the build time includes the pruning. ``start`` (a first assignment for SCIP) is kept
    through the pruning: keeping a candidate never loses the optimum."""
    if not options.prune:
        return _run(objectives, options, memory, deadline, start)
    t0 = time.perf_counter()
    if memory is None:
        keep = dominance_survivors(objectives)
    else:
        keep = dominance_survivors(objectives, memory.per_op, memory.limit / memory.layers)
    if start is not None:
        keep = {v: np.union1d(k, [start[v]]) for v, k in keep.items()}
    objectives, memory, start = _restricted(objectives, memory, keep, start)
    prune_time = time.perf_counter() - t0
    run = _run(objectives, options, memory, deadline, start)
    return replace(
        run,
        choice=_lifted(run.choice, keep),
        build_time=prune_time + run.build_time,
    )
