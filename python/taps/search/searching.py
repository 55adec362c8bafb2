"""The search: the best strategy for every operator of a graph on a cluster (TAPS)."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Literal, overload

from taps._core import Cluster
from taps._support.arguments import flag, instance, number, some
from taps._support.deadline import left
from taps._support.limits import (
    check_candidates,
    check_table_memory,
    core_threads,
    optimal_bytes,
)
from taps.errors import ArgumentError, GraphError
from taps.graph import Graph, Operator
from taps.plan.plan import Plan
from taps.plan.pricing import Pricing
from taps.plan.stages import Pipeline
from taps.search.evaluate import OpCost, StepTime, breakdown, evaluate
from taps.search.pipeline import PipelineResult, search_pipeline
from taps.search.tables import build_tables
from taps.solve.pipeline import Rounds, solve
from taps.solve.problem import IlpOptions, IlpSize

#: The stages of ``SearchResult.timings``, in order (``total`` is end to end).
STAGES = ("enumerate", "costs", "reduce", "build", "solve", "extract", "total")


@dataclass(frozen=True)
class SearchResult:
    """What the search chose and what it costs.

    ``plan`` is the chosen strategy of every operator with its pricing; ``cost`` is what the
    search minimised, in seconds for the topology model (communication, and with compute counted
    compute too, the gradient reductions' overlap in its additive form) and bytes per device for
    the volume model; ``breakdown`` says per operator where it goes, and ``step`` gives the step
    time, compute and exposed communication. ``num_aux_edges`` is the paper's |E_A| (one per pair
    of strategies across a graph edge); ``ilp`` is the size of the problem SCIP solved.
    """

    plan: Plan
    cost: float
    breakdown: list[OpCost]
    status: str
    gap: float
    solve_time: float
    num_aux_edges: int
    ilp: IlpSize
    memory_per_device: float
    timings: dict[str, float]

    @property
    def step(self) -> StepTime:
        """The plan's step: compute, communication, exposed communication and step time (the
        gradient reductions' overlap from the timeline of the backward)."""
        return StepTime.of(self.breakdown)


@overload
def search(
    graph: Graph,
    cluster: Cluster,
    pricing: Pricing = ...,
    *,
    memory_limit: float | None = ...,
    time_limit: float | None = ...,
    options: IlpOptions = ...,
    tie: bool = ...,
    replicate: bool = ...,
    pipeline: Literal[False] = ...,
) -> SearchResult: ...
@overload
def search(
    graph: Graph,
    cluster: Cluster,
    pricing: Pricing = ...,
    *,
    memory_limit: float | None = ...,
    time_limit: float | None = ...,
    options: IlpOptions = ...,
    tie: bool = ...,
    replicate: bool = ...,
    pipeline: Literal[True] | Pipeline,
) -> PipelineResult: ...
def search(
    graph: Graph,
    cluster: Cluster,
    pricing: Pricing = Pricing(),
    *,
    memory_limit: float | None = None,
    time_limit: float | None = None,
    options: IlpOptions = IlpOptions(),
    tie: bool = True,
    replicate: bool = False,
    pipeline: bool | Pipeline = False,
) -> SearchResult | PipelineResult:
    """Find the plan, a strategy for every operator, that minimises the step time under
    ``pricing`` (the ILP of docs/conventions.md#the-ilp): communication, and with
    ``pricing.counts_compute`` (the default under the topology model) each operator's compute,
    its parameters' gradient reductions overlapping its backward.

    ``pricing.step="training"`` (the default) prices the whole training step: partial sums flow
    to the consumer, every edge also pays its backward redistribution, and only parameters' and
    graph inputs' gradients are reduced at their operators (addends' over the output axes they
    lack); ``"forward"`` keeps the paper's model. ``pricing.planner`` plans every edge:
    ``"paper"`` (the default), Algorithm 1, with partial sums all_reduced first; ``"optimal"``,
    the shortest plan (reduce_scatter, collective_permute; the cheapest within a search budget,
    docs/core.md), tens of times slower per edge. ``pricing.zero`` shards parameters' gradients
    and optimizer state over their data-parallel devices (ZeRO: reduce_scatter and all_gather,
    less memory). See docs/search.md.

    ``memory_limit`` (bytes per device) defaults to ``cluster.device_memory``; ``time_limit``
    (seconds) bounds the whole search: SCIP gets what the cost tables leave of it and returns its
    best assignment so far, with its gap (``status`` "timelimit"). ``options`` switches the ILP's
    formulation and speed-ups (all exact). With ``tie`` (the default) the graph's tied repeats
    (:meth:`taps.Graph.tie`) take one set of strategies, so the search costs what one repeat does;
    every repeat's cost and memory is still counted. ``tie=False`` searches every operator on its
    own. ``replicate`` widens every operator's candidates to the splits over fewer devices than
    the cluster has, the rest holding replicas (docs/replicas.md); without it, only an operator
    with no split over every device gets those. A search whose cost tables would not fit this
    machine's memory is refused up front (:class:`taps.errors.ResourceError`); so is an operator
    with too many candidates.

    ``pipeline=True`` (or a :class:`taps.Pipeline` fixing any of its fields) searches the whole
    plan of a multi-node run instead: pipeline stages, each planned by this search on its
    sub-cluster (docs/pipeline.md); it returns a :class:`taps.search.pipeline.PipelineResult`
    whose plan has ``stages``.
    """
    t0 = time.perf_counter()
    if pipeline is not False:
        if not isinstance(pipeline, (bool, Pipeline)):
            raise TypeError(
                f"search: pipeline must be a bool or a taps.Pipeline, got {type(pipeline).__name__}"
            )
        _check("search", graph, cluster, pricing, memory_limit, time_limit)
        _check_flags(options, tie, replicate)
        # The pipeline search plans its units with its own settings: these would be ignored.
        ignored = [
            name
            for name, given in (
                ("time_limit", time_limit is not None),
                ("options", options != IlpOptions()),
                ("tie=False", not tie),
                ("replicate=True", replicate),
                (f"cost_model={pricing.cost_model!r}", pricing.cost_model != "topology"),
            )
            if given
        ]
        if ignored:
            raise ArgumentError(
                "search: a pipeline search prices steps in seconds on the topology model, "
                f"with its own settings: leave out {', '.join(ignored)}"
            )
        spec = pipeline if isinstance(pipeline, Pipeline) else Pipeline()
        return search_pipeline(graph, cluster, pricing, spec, memory_limit)
    _check("search", graph, cluster, pricing, memory_limit, time_limit, replicate)
    _check_flags(options, tie, replicate)
    deadline = None if time_limit is None else t0 + time_limit
    with _collector_paused():
        return _search(graph, cluster, pricing, memory_limit, deadline, options, tie, replicate)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector paused for the search: the tables allocate hundreds of thousands
    of objects (candidates, layouts, arrays) that form no cycle, and every collection they set
    off walks the whole heap, a converted torch model's too (Swin on 8 x 8 after its conversion:
    552 collections, 1.4 s of the search's 5.7 s of CPU). Reference counting still frees what
    the search drops."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _check(
    where: str,
    graph: Graph,
    cluster: Cluster,
    pricing: Pricing,
    memory_limit: float | None,
    time_limit: float | None,
    replicate: bool = False,
) -> None:
    """The arguments' types and ranges, and the size of the search against the machine."""
    instance(where, "graph", graph, Graph)
    instance(where, "cluster", cluster, Cluster)
    instance(where, "pricing", pricing, Pricing)
    if memory_limit is not None and number(where, "memory_limit", memory_limit) < 1:
        raise ArgumentError(f"{where}: memory_limit must be at least 1 byte, got {memory_limit!r}")
    if time_limit is not None:
        number(where, "time_limit", time_limit)
    # A search's fsdp names the operators that may shard: a name the graph lacks is a typo or
    # another graph's operator, which would be silently left out.
    names = {op.name for op in graph.ops}
    if isinstance(pricing.fsdp, tuple) and (foreign := [n for n in pricing.fsdp if n not in names]):
        raise GraphError(
            f"{where}: fsdp names operators graph {graph.name!r} does not have: {some(foreign)}"
        )
    # The tables are shared by operators of one signature and edges between the same signatures
    # (build_tables), so only the distinct ones take memory. Under FSDP an operator holding
    # parameters may have a twin of every candidate (sharded storage): counted at most.
    signature = {
        op.name: (
            graph.signature(op.name),
            pricing.shards(op.name) and _holds_parameters(graph, op),
        )
        for op in graph.ops
    }
    counts: dict[object, int] = {}
    for op in graph.ops:
        if signature[op.name] not in counts:
            count = check_candidates(
                op.name, op.partitionable_sizes, cluster.num_devices, replicate
            )
            counts[signature[op.name]] = 2 * count if signature[op.name][1] else count
    edges = {(signature[e.producer], signature[e.consumer], e.slot) for e in graph.edges}
    # The training step prices every edge both ways, a cost matrix per direction (measured on
    # a GPT block with replicas on 1,024 devices: 1.55x the one-way estimate resident; the
    # forward step 0.63x).
    directions = 2 if pricing.step == "training" else 1
    pairs = directions * sum(counts[u] * counts[w] for u, w, _ in edges)
    planner = (
        optimal_bytes(cluster.num_devices, core_threads()) if pricing.planner == "optimal" else 0
    )
    check_table_memory(
        f"{graph.name!r} on {cluster.num_devices:,} devices", sum(counts.values()), pairs, planner
    )


def _check_flags(options: IlpOptions, tie: bool, replicate: bool) -> None:
    if not isinstance(options, IlpOptions):
        raise TypeError(f"search: options must be an IlpOptions, got {type(options).__name__}")
    flag("search", "tie", tie)
    flag("search", "replicate", replicate)


def _holds_parameters(graph: Graph, op: Operator) -> bool:
    """Whether an input of ``op`` is (a view of) a parameter."""
    return any(graph.root(o.tensor).kind == "parameter" for o in op.inputs)


def _search(
    graph: Graph,
    cluster: Cluster,
    pricing: Pricing,
    memory_limit: float | None,
    deadline: float | None,
    options: IlpOptions,
    tie: bool = True,
    replicate: bool = False,
) -> SearchResult:
    """:func:`search` of checked arguments, SCIP stopping at ``deadline`` (perf_counter)."""
    t0 = time.perf_counter()
    tables = build_tables(
        graph, cluster, pricing, replicas=replicate, deadline=deadline, bounded=True
    )
    limit = memory_limit if memory_limit is not None else cluster.device_memory
    # Rounds only where there are rounds: the last round's products are kept by digests.
    rounds = Rounds() if tables.refine is not None else None
    solution = solve(tables, limit, left(deadline), options, tie=tie, rounds=rounds)
    # The optimal planner's tables hold lower bounds: an assignment whose edges are all priced
    # exactly costs no more than any other, each at most its bounded price (docs/search.md).
    # Each round changes a few pair costs, so the next solve takes the last one's reductions.
    # (The spare pairs' reductions take the solves' products, and leave theirs to the next.)
    products = None if rounds is None else rounds.products
    while tables.refine is not None and tables.refine(solution.choice, products):
        solution = solve(tables, limit, left(deadline), options, tie=tie, rounds=rounds)
    t1 = time.perf_counter()
    plan = Plan(
        graph, cluster, tables.strategies(solution.choice), tables.pricing_of(solution.choice)
    )
    memory = graph.layers * sum(
        float(tables.ops[name].memory[i]) for name, i in solution.choice.items()
    )
    rows = breakdown(plan)
    t2 = time.perf_counter()
    timings = dict(tables.timings)
    timings.update(
        build=solution.build_time,
        reduce=solution.reduce_time,
        solve=solution.solve_time,
        extract=t2 - t1,
        total=t2 - t0,
    )
    return SearchResult(
        plan=plan,
        cost=tables.evaluate(solution.choice),
        breakdown=rows,
        status=solution.status,
        gap=solution.gap,
        solve_time=solution.solve_time,
        num_aux_edges=tables.num_aux_edges,
        ilp=solution.size,
        memory_per_device=memory,
        timings=timings,
    )


@dataclass(frozen=True)
class Comparison:
    """Topology-aware against volume-based search, both priced under the topology model."""

    topology: SearchResult
    volume: SearchResult
    #: The volume-based result priced under the topology model (seconds).
    volume_under_topology: float
    #: The topology-aware result priced under the volume model (bytes per device).
    topology_under_volume: float

    @property
    def saving(self) -> float:
        """Percent less time (what the topology model prices: the step with compute counted, its
        communication without) of the topology-aware result."""
        if self.volume_under_topology == 0:
            return 0.0
        return 100.0 * (1.0 - self.topology.cost / self.volume_under_topology)


def compare(
    graph: Graph,
    cluster: Cluster,
    pricing: Pricing = Pricing(),
    *,
    memory_limit: float | None = None,
    time_limit: float | None = None,
) -> Comparison:
    """Search under both cost models (``pricing`` gives the rest: step, planner, ZeRO) and price
    both results under the topology model; ``time_limit`` bounds both searches together."""
    t0 = time.perf_counter()
    _check("compare", graph, cluster, pricing, memory_limit, time_limit)
    deadline = None if time_limit is None else t0 + time_limit
    topo, vol = (
        _search(
            graph,
            cluster,
            replace(
                pricing, cost_model=model, compute=pricing.compute if model == "topology" else False
            ),
            memory_limit,
            deadline,
            IlpOptions(),
        )
        for model in ("topology", "volume")
    )
    return Comparison(
        topo,
        vol,
        evaluate(vol.plan.with_pricing(topo.plan.pricing)),
        evaluate(topo.plan.with_pricing(vol.plan.pricing)),
    )
