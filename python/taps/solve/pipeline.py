"""The solve pipeline: one candidate per operator at the least cost, under a memory limit.

Stage by stage (each exact; :class:`taps.solve.problem.IlpOptions` switches them):

1. tied repeats folded to one block's choices (:mod:`taps.solve.ties`);
2. exact reductions, leaf, series, parallel and fixed operators, by dynamic programming
   (:mod:`taps.solve.reductions`);
3. under a memory limit, the pieces of operators whose memory does not depend on their choice
   eliminated (:mod:`taps.solve.steady`); under a binding one, a Lagrangian price on memory
   that decides the problem or prunes it and gives SCIP a first assignment
   (:mod:`taps.solve.memory_price`), then what it leaves solved over (cost, memory) Pareto
   frontiers when they fit a budget (:mod:`taps.solve.pareto`);
4. what the reductions leave solved by variable elimination when its tables are small
   (:mod:`taps.solve.elimination`);
5. otherwise dominated candidates pruned (:mod:`taps.solve.prune`) and the ILP solved by SCIP
   (:mod:`taps.solve.ilp`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from taps._support.deadline import check
from taps.errors import InfeasibleError, TapsError, TimeLimitError
from taps.solve.elimination import WORK_PER_FLOW, elimination_order
from taps.solve.ilp import MEMORY_FEASTOL, solve_ilp
from taps.solve.memory_price import price_memory, prune_by_price
from taps.solve.pareto import solve_pareto
from taps.solve.problem import IlpOptions, IlpSize, IlpSolution, Instance, MemoryLimit, Problem
from taps.solve.prune import dominance_survivors, negated, restrict
from taps.solve.reductions import Products, Reduction, reduce, reduce_again
from taps.solve.steady import eliminate_pieces
from taps.solve.ties import Ties


def smallest_memory(instance: Instance) -> float:
    """The least memory per device any assignment needs (memory adds up per operator)."""
    per_layer = sum(float(m.min()) for m in instance.memory_per_op.values())
    return per_layer * instance.layers


def layer_count(instance: Instance) -> int:
    """How many layers the memory counts: the graph's ``layers`` times the instances of its
    largest tie (a model whose 32 blocks are tied in one graph has 32)."""
    return instance.layers * max((len(group) for group in instance.tied), default=1)


def largest_needs(instance: Instance, count: int = 3) -> list[tuple[str, int, float]]:
    """The ``count`` operators that need the most memory at their least, as (name, copies,
    bytes of all copies), an operator of a tie standing for every instance of it (named by
    its first)."""
    copies: dict[str, list[str]] = {}
    tied = {n for group in instance.tied for inst in group for n in inst}
    for group in instance.tied:
        for position, name in enumerate(group[0]):
            copies[name] = [inst[position] for inst in group]
    per_op = instance.memory_per_op
    for name in per_op:
        if name not in tied:
            copies[name] = [name]
    need = [
        (name, len(same), instance.layers * sum(float(per_op[n].min()) for n in same))
        for name, same in copies.items()
    ]
    return sorted(need, key=lambda x: -x[2])[:count]


def _check_memory(instance: Instance, memory_limit: float | None) -> None:
    if memory_limit is None:
        return
    need = smallest_memory(instance)
    if need > memory_limit:
        most = ", ".join(
            f"{name!r}{f' x{n}' if n > 1 else ''} {size:,.0f}"
            for name, n, size in largest_needs(instance)
        )
        raise InfeasibleError(
            f"no assignment fits in the memory limit of {memory_limit:,.0f} bytes per device: "
            f"the smallest needs {need:,.0f} bytes for {layer_count(instance)} layer(s); "
            f"most of it (bytes at least): {most}"
        )


@dataclass
class Rounds:
    """For a caller that solves problems of one form again and again, changing costs' values
    between solves, not the memory or its limit (the optimal search's rounds): the last solve's
    reductions, which the next takes again (:func:`taps.solve.reductions.reduce_again`) rather
    than looking for them, and its min-plus products, which a fresh reduction takes where their
    operands are unchanged."""

    reduction: Reduction | None = None
    products: Products = field(default_factory=Products)


def solve(
    instance: Instance,
    memory_limit: float | None = None,
    time_limit: float | None = None,
    options: IlpOptions = IlpOptions(),
    tie_break: tuple[Instance, str] | None = None,
    tie: bool = True,
    rounds: Rounds | None = None,
) -> IlpSolution:
    """Pick one candidate per operator minimising the total cost, under a per-device memory
    limit if given. Raises InfeasibleError if no assignment fits the memory limit. The choice
    indexes the candidates of ``instance`` whatever the options. ``time_limit`` (seconds) bounds
    the whole call: every stage checks it, and every SCIP solve in it gets what is left. When it
    runs out before SCIP, the result is SCIP's first assignment (each operator's cheapest
    candidate) with status ``timelimit``.

    ``tie_break=(other, "min" | "max")`` solves lexicographically: among the assignments optimal
    for ``instance``, the one with the least (or most) cost under ``other``, which must have the
    same operators and candidates (another cost model's tables). Status, gap and time are those of
    the second solve.

    With ``tie`` (the default) the tied repeats take one set of choices (:mod:`taps.solve.ties`);
    ``tie=False`` decides every operator on its own. ``rounds`` carries the reductions from one
    solve to the next (:class:`Rounds`)."""
    deadline = None if time_limit is None else time.perf_counter() + time_limit
    if rounds is None or rounds.reduction is None:
        _check_memory(instance, memory_limit)  # (a round's memory is the first round's)
    if tie_break is not None and tie_break[1] not in ("min", "max"):
        raise TapsError(f"tie_break sense must be 'min' or 'max', got {tie_break[1]!r}")
    objectives = [instance.problem()]
    if tie_break is not None:
        other = tie_break[0].problem()
        # Minimised from here on: the most of the other cost is the least of its negation.
        objectives.append(other if tie_break[1] == "min" else negated(other))
    per_op = dict(instance.memory_per_op)
    ties = Ties.of(list(per_op), instance.tied) if tie and instance.tied else None
    if ties is not None:
        objectives = ties.fold(objectives)
        per_op = ties.fold_memory(per_op)
    memory = None if memory_limit is None else MemoryLimit(per_op, instance.layers, memory_limit)
    try:
        solution = _solve(objectives, memory, options, deadline, rounds)
    except TimeLimitError:
        solution = _out_of_time(objectives[0], memory)
    if ties is not None:
        solution = replace(solution, choice=ties.expand(solution.choice))
    return solution


def _out_of_time(problem: Problem, memory: MemoryLimit | None) -> IlpSolution:
    """What a solve whose time ran out before SCIP returns: SCIP's first assignment (each
    operator's cheapest candidate on its own), status ``timelimit`` and no bound (gap inf); a
    :class:`taps.errors.TimeLimitError` if that assignment does not fit the memory limit."""
    choice = {v: int(np.argmin(c)) for v, c in problem.node_cost.items()}
    if memory is not None and memory.of(choice) > memory.limit * (1 + MEMORY_FEASTOL):
        raise TimeLimitError(
            "the time limit ran out before the search found an assignment that fits the "
            f"memory limit of {memory.limit:,.0f} bytes per device"
        )
    return IlpSolution(choice, "timelimit", math.inf, 0.0, 0.0, 0.0, IlpSize(0, 0, 0, 0))


def _solve(
    objectives: list[Problem],
    memory: MemoryLimit | None,
    options: IlpOptions,
    deadline: float | None,
    rounds: Rounds | None = None,
) -> IlpSolution:
    if not options.reduce:
        return _pruned_run(objectives, options, memory, deadline)
    order = list(objectives[0].node_cost)
    free = _reduced(objectives, order, None, options, deadline, rounds=rounds)
    # The optimum without the memory limit is optimal with it if it fits. (Reduced on its own,
    # not after the steady operators below: eliminating those first joins their wide neighbours
    # by large pair costs, ConvNeXt's blocks on 8 x 8 by 1,649 x 1,649 ones, 4 times the time.)
    if memory is None or memory.of(free.choice) <= memory.limit:
        return free
    # Operators whose memory is the same whatever their candidate (elementwise ones, whose every
    # split shards the output evenly) can go exactly under any limit: reduced once, and their
    # pieces with at most two operators around them eliminated (taps.solve.steady).
    steady = {v for v, m in memory.per_op.items() if np.ptp(m) == 0}
    t0 = time.perf_counter()
    pre = reduce(objectives, order, steady, deadline)
    pieces = None
    if options.eliminate and len(objectives) == 1:
        pieces = eliminate_pieces(pre.cores[0], steady, deadline)
        check(deadline, "eliminating the steady pieces")
    cores = pre.cores if pieces is None else [pieces.problem]
    eliminated = pre.eliminated + (0 if pieces is None else pieces.eliminated)
    pre_time = time.perf_counter() - t0
    again = _reduced(cores, list(cores[0].node_cost), memory, options, deadline, steady)
    choice = pre.expand(again.choice if pieces is None else pieces.expand(again.choice))
    return replace(
        again,
        choice=choice,
        reduce_time=again.reduce_time + free.reduce_time + pre_time,
        size=replace(again.size, eliminated=again.size.eliminated + eliminated),
    )


def _reduced(
    objectives: list[Problem],
    order: list[str],
    memory: MemoryLimit | None,
    options: IlpOptions,
    deadline: float | None,
    eliminable: set[str] | None = None,
    rounds: Rounds | None = None,
) -> IlpSolution:
    """Solve after the exact reductions (of the ``eliminable`` operators only, if given, which
    must have the same memory for every candidate when ``memory`` is given), those of
    ``rounds`` taken again where they apply."""
    t0 = time.perf_counter()
    reduction = None
    if rounds is not None and rounds.reduction is not None and eliminable is None:
        reduction = reduce_again(objectives, order, rounds.reduction)
    if reduction is None:
        products = None if rounds is None else rounds.products
        reduction = reduce(objectives, order, eliminable, deadline, products)
        if products is not None:
            products.next_round()  # before the caller changes any cost
    if rounds is not None:
        rounds.reduction = reduction
    reduce_time = time.perf_counter() - t0
    core = reduction.cores[0]
    if memory is not None:
        gone = [v for v in memory.per_op if v not in core.node_cost]
        fixed = memory.layers * sum(float(memory.per_op[v][0]) for v in gone)
        memory = MemoryLimit(
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
    # Whatever its size, elimination is run when it is expected no slower than SCIP on this core
    # (DeepSeek-V3's MLA core: 1.2 M flows, beyond SCIP's memory, eliminated in about 5 s).
    elimination = elimination_order(objectives[0], max_work=WORK_PER_FLOW * flows)
    solved = None if elimination is None else elimination.solve(deadline)
    if solved is None:
        return None
    size = IlpSize(0, 0, 0, 0, eliminated=len(objectives[0].node_cost))
    return IlpSolution(solved[0], "optimal", 0.0, 0.0, 0.0, time.perf_counter() - t0, size)


def _limited(
    objectives: list[Problem],
    memory: MemoryLimit,
    options: IlpOptions,
    deadline: float | None,
) -> IlpSolution:
    """The core left by the reductions, under the memory limit: priced first
    (taps.solve.memory_price), which decides it when the price closes the gap and otherwise prunes
    it exactly and gives SCIP its first assignment. ``size.eliminated`` counts the operators the
    price decided."""
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
    assert kept_memory is not None and start is not None
    exact = solve_pareto(
        restricted[0],
        {v: m * memory.layers for v, m in kept_memory.per_op.items()},
        memory.limit,
        deadline,
        (priced.price, priced.bound, start),
    )
    if exact is not None:
        size = IlpSize(0, 0, 0, 0, eliminated=len(problem.node_cost))
        return IlpSolution(
            _lifted(exact, keep), "optimal", 0.0, 0.0, 0.0, time.perf_counter() - t0, size
        )
    price_time = time.perf_counter() - t0
    run = _pruned_run(restricted, options, kept_memory, deadline, start)
    return replace(run, choice=_lifted(run.choice, keep), reduce_time=price_time)


def _restricted(
    objectives: list[Problem],
    memory: MemoryLimit | None,
    keep: dict[str, np.ndarray],
    start: dict[str, int] | None,
) -> tuple[list[Problem], MemoryLimit | None, dict[str, int] | None]:
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
    memory: MemoryLimit | None,
    deadline: float | None,
    start: dict[str, int] | None = None,
) -> IlpSolution:
    """:func:`taps.solve.ilp.solve_ilp` of the objectives (one, or two to minimise
    lexicographically) on the candidates that survive pruning (if on); the choice indexes the
    candidates of the problems, and the build time includes the pruning. ``start`` (a first
    assignment for SCIP) is kept through the pruning: keeping a candidate never loses the
    optimum."""
    if not options.prune:
        return solve_ilp(objectives, options, memory, deadline, start)
    t0 = time.perf_counter()
    if memory is None:
        keep = dominance_survivors(objectives, deadline=deadline)
    else:
        budget = memory.limit / memory.layers
        keep = dominance_survivors(objectives, memory.per_op, budget, deadline)
    if start is not None:
        keep = {v: np.union1d(k, [start[v]]) for v, k in keep.items()}
    objectives, memory, start = _restricted(objectives, memory, keep, start)
    prune_time = time.perf_counter() - t0
    run = solve_ilp(objectives, options, memory, deadline, start)
    return replace(
        run,
        choice=_lifted(run.choice, keep),
        build_time=prune_time + run.build_time,
    )
