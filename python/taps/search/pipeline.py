"""The stage search: the inter-operator half of a plan (docs/pipeline.md).

The graph is cut, in its operator order, into units: its tied layers (each instance of a tie,
and the runs of operators between them) when it has ties, else the runs between single-tensor
cuts (a cut that one tensor crosses, a module's boundary in a torch-exported graph). Every unit
is planned by taps' intra-operator search (the cost tables and the solver
:func:`taps.search.searching.search` runs) on its sub-graph at the microbatch's batch, on a
sub-cluster of the stage's shape, once per (unit signature, sub-cluster shape, microbatch,
memory share), its tables built once for every share: a tie's instances share them. A stage
(a run of units) costs the sum of its units: its forward and backward per microbatch, its
parameters' memory and its activations per microbatch in flight.

For every pipeline (data-parallel copies, device groups of one shape, chunks, microbatches,
schedule) a dynamic programme over the cuts (Alpa's, Zheng et al. 2022) minimises the
schedule's step time (:mod:`taps.search.schedules`): for a bound on every stage's time per
microbatch it finds the cuts of least total time that fit in memory, with stage ``k``'s
activations held for its schedule's microbatches in flight; the bounds are tried from the least
that any cuts meet (a min-max programme) upwards, until the bound alone costs more than the best
step found. The chosen stages are then planned again whole (their units' strategies together)
and priced by :func:`taps.search.evaluate.breakdown`, and the step adds the reductions of the
gradients over the data-parallel copies after the pipeline's flush.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from taps._core import Cluster, InfeasibleError, Layout, Strategy, least_bottleneck, least_cuts
from taps.errors import ArgumentError
from taps.graph import Graph
from taps.plan.plan import Plan
from taps.plan.pricing import Pricing
from taps.plan.stages import (
    SCHEDULES,
    Pipeline,
    Stage,
    batch_of,
    microbatched,
    stage_graph,
    sub_cluster,
)
from taps.search.evaluate import OpCost, breakdown
from taps.search.prices import memory, saved_bytes
from taps.search.schedules import in_flight, step_time
from taps.search.tables import CostTables, build_tables
from taps.solve.pipeline import solve


@dataclass(frozen=True)
class UnitCost:
    """One unit planned on one sub-cluster at one microbatch: seconds per microbatch forward and
    backward (its parameters' gradient reductions apart), seconds of those reductions per step,
    bytes per device of its parameters (with what training keeps of them), of the activations
    of one microbatch, and held once while it recomputes (checkpointed), and the strategies
    chosen."""

    forward: float
    backward: float
    gradients: float
    parameters: float
    activations: float
    buffer: float
    strategies: dict[str, Strategy]


@dataclass(frozen=True)
class PipelineResult:
    """What the stage search chose: the pipelined ``plan`` (``plan.stages``, ``plan.pipeline``),
    its predicted ``step_time`` (seconds: the schedule's, bubble included, and the gradients'
    reduction over the copies), the most memory a device needs, the unit searches it ran and its
    seconds, and the least step found per schedule: the chosen schedule's is its optimum, the
    others' the best of the pipelines that were cut (one that cannot beat the best found is
    not), ``None`` if none was."""

    plan: Plan
    step_time: float
    memory_per_device: float
    unit_searches: int
    seconds: float
    by_schedule: dict[str, float | None]

    @property
    def cost(self) -> float:
        """The step time (what the search minimised)."""
        return self.step_time


def units_of(graph: Graph) -> list[tuple[str, ...]]:
    """The graph's operators cut into units (the module docstring): runs between the places a
    stage may start."""
    names = [op.name for op in graph.ops]
    starts = sorted(set(cut_points(graph)) | {0})
    bounds = [*starts, len(names)]
    return [tuple(names[a:b]) for a, b in itertools.pairwise(bounds) if a < b]


def cut_points(graph: Graph) -> list[int]:
    """The operator indices where a stage may start: the starts and ends of the tied layers'
    instances when the graph has ties, else every index that one tensor crosses (made before it,
    read at or after it)."""
    ops = graph.ops
    index = {op.name: i for i, op in enumerate(ops)}
    if graph.tied:
        out = set()
        for tie in graph.tied:
            for inst in tie:
                first = min(index[n] for n in inst)
                last = max(index[n] for n in inst)
                out |= {first, last + 1}
        return sorted(i for i in out if 0 < i < len(ops))
    last_read: dict[str, int] = {}
    for i, op in enumerate(ops):
        for o in op.inputs:
            root = graph.root(o.tensor)
            if root.producer is not None:
                last_read[root.name] = i
    crossing = [0] * (len(ops) + 1)
    for tensor, last in last_read.items():
        made = index[graph.tensors[tensor].producer or ""]
        for i in range(made + 1, last + 1):
            crossing[i] += 1
    return [i for i in range(1, len(ops)) if crossing[i] == 1]


def _unit_keys(graph: Graph, units: Sequence[tuple[str, ...]]) -> list[object]:
    """A key per unit: the instances of one tie share theirs (their sub-graphs are alike)."""
    tied = {inst: (t, len(inst)) for t, tie in enumerate(graph.tied) for inst in tie}
    return [tied.get(u, u) for u in units]


def crossing_bytes(graph: Graph, units: Sequence[tuple[str, ...]]) -> list[float]:
    """Per unit boundary ``i`` (after unit ``i``), the bytes of the tensors made before it and
    read after it (whole, at the graph's batch)."""
    where = {n: i for i, u in enumerate(units) for n in u}
    last: dict[str, int] = {}
    for op in graph.ops:
        for o in op.inputs:
            root = graph.root(o.tensor)
            if root.producer is not None:
                last[root.name] = max(last.get(root.name, 0), where[op.name])
    out = [0.0] * len(units)
    for tensor, reader in last.items():
        t = graph.tensors[tensor]
        made = where[t.producer or ""]
        for i in range(made, reader):
            out[i] += t.numel * t.dtype_bytes
    return out


def send_seconds(cluster: Cluster, size: int, nbytes: float) -> float:
    """Seconds for a group of ``size`` devices to hand ``nbytes`` (the whole tensors, each device
    sending its ``1/size``) to the next group of ``size``: an all_gather over the pairs of ranks
    ``size`` apart on the two groups' devices, one step, priced by the cluster's links (inside a
    node if the two groups share one, else out of it, every sender of a node at once)."""
    if nbytes == 0:
        return 0.0
    pair = _slice(cluster, 2 * size)
    shard = max(1, math.ceil(nbytes / size))
    # Tensor dim 0 split over both device dims (outer major): gathering along the outer dim
    # hands each device its partner's shard.
    layout = Layout([2, size * shard], [2, size], [1, 0])
    return pair.collective_cost(layout, "all_gather", 1, 1.0)


def _slice(cluster: Cluster, devices: int) -> Cluster:
    """The sub-cluster of ``devices`` consecutive devices from rank 0."""
    per = cluster.devices_per_node
    if devices <= per:
        return sub_cluster(cluster, 1, devices)
    return sub_cluster(cluster, devices // per, per)


def _powers(n: int) -> list[int]:
    return [1 << i for i in range(n.bit_length()) if n % (1 << i) == 0]


class _Units:
    """Every unit's cost, searched once per (unit key, sub-cluster shape, microbatch, share)."""

    def __init__(self, graph: Graph, cluster: Cluster, pricing: Pricing, limit: float) -> None:
        self.graph, self.cluster, self.pricing, self.limit = graph, cluster, pricing, limit
        self.units = units_of(graph)
        self.keys = _unit_keys(graph, self.units)
        self.crossing = crossing_bytes(graph, self.units)
        self._graphs: dict[object, Graph] = {}
        self._tables: dict[object, CostTables] = {}
        self._costs: dict[tuple[object, int, int, int], UnitCost | None] = {}
        self._lists: dict[tuple[int, int, int], list[UnitCost] | None] = {}
        self._sends: dict[tuple[int, int], np.ndarray] = {}
        self._chains: dict[tuple[int, int, int], _Chain | None] = {}
        self.searches = 0

    def unit_graph(self, unit: int, parts: int) -> Graph:
        """The sub-graph of unit ``unit`` (:func:`stage_graph`) on ``1/parts`` of the batch."""
        key = (self.keys[unit], parts)
        if key not in self._graphs:
            whole = stage_graph(self.graph, self.units[unit])
            self._graphs[key] = microbatched(whole, parts)
        return self._graphs[key]

    def costs(self, devices: int, parts: int, share: int) -> list[UnitCost] | None:
        """Every unit's :meth:`cost` (``None`` if one does not fit)."""
        key = (devices, parts, share)
        if key not in self._lists:
            costs = [self.cost(u, devices, parts, share) for u in range(len(self.units))]
            self._lists[key] = None if None in costs else [x for x in costs if x is not None]
        return self._lists[key]

    def sends(self, devices: int, parts: int) -> np.ndarray:
        """Seconds across each unit boundary between groups of ``devices`` at ``1/parts`` of the
        batch (:func:`send_seconds`)."""
        key = (devices, parts)
        if key not in self._sends:
            if 2 * devices > self.cluster.num_devices:
                # One group on the whole cluster: its stages (chunks) hand nothing to another.
                self._sends[key] = np.zeros(len(self.crossing) - 1)
            else:
                self._sends[key] = np.array(
                    [send_seconds(self.cluster, devices, b / parts) for b in self.crossing[:-1]]
                )
        return self._sends[key]

    def chain(self, devices: int, parts: int, share: int) -> _Chain | None:
        """The units' :class:`_Chain` (``None`` if one does not fit)."""
        key = (devices, parts, share)
        if key not in self._chains:
            costs = self.costs(devices, parts, share)
            self._chains[key] = (
                None
                if costs is None
                else _Chain.of(costs, self.pricing, self.sends(devices, parts))
            )
        return self._chains[key]

    def cost(self, unit: int, devices: int, parts: int, share: int) -> UnitCost | None:
        """Unit ``unit`` on ``devices`` at ``1/parts`` of the batch, searched within ``1/share``
        of the device memory (``None``: nothing fits)."""
        key = (self.keys[unit], devices, parts, share)
        if key not in self._costs:
            whole = self.cost(unit, devices, parts, 1) if share > 1 else None
            need = None if whole is None else whole.parameters + whole.activations + whole.buffer
            if need is not None and need <= self.limit / share:
                # The plan within the whole device fits the share too: it is the optimum there.
                self._costs[key] = whole
            else:
                self._costs[key] = self._search(unit, devices, parts, share)
        return self._costs[key]

    def _search(self, unit: int, devices: int, parts: int, share: int) -> UnitCost | None:
        """taps' intra-operator search of the unit (as :func:`taps.search.searching.search`
        runs it), its cost tables built once for every share of the memory."""
        sub = self.unit_graph(unit, parts)
        where = _slice(self.cluster, devices)
        key = (self.keys[unit], devices, parts)
        if key not in self._tables:
            self._tables[key] = build_tables(sub, where, self.pricing)
        tables = self._tables[key]
        self.searches += 1
        try:
            solution = solve(tables, self.limit / share if math.isfinite(self.limit) else None)
        except InfeasibleError:
            return None
        plan = Plan(sub, where, tables.strategies(solution.choice), self.pricing)
        return _unit_cost(plan, breakdown(plan))


def _unit_cost(plan: Plan, rows: Sequence[OpCost]) -> UnitCost:
    """A searched unit's :class:`UnitCost` from its plan and breakdown. With every layer
    checkpointed (``checkpoint=1``) a microbatch in flight keeps only what leaves the unit, and
    the unit's saved outputs are held once more while its forward runs again."""
    graph = plan.graph
    forward = backward = gradients = parameters = saved = leaving = 0.0
    read = {graph.root(o.tensor).name for op in graph.ops for o in op.inputs}
    for r in rows:
        forward += r.forward_compute + sum(i.cost for i in r.incoming)
        backward += r.backward_compute + sum(i.backward_cost for i in r.incoming)
        for c, cost in r.collectives:
            if c.parameter:
                gradients += cost
            elif c.reason == "gradient":
                backward += cost
            else:
                forward += cost
        op = graph.op(r.name)
        candidate = plan.candidates[r.name]
        dtype = graph.tensors[op.output.tensor].dtype_bytes
        parameters += memory(graph, op, candidate, plan.pricing, kept=0.0)
        saved += saved_bytes(op, candidate.output, dtype)
        if op.output.tensor not in read:
            leaving += math.prod(candidate.output.shard_shape) * dtype
    checkpointed = plan.pricing.checkpoint == 1
    return UnitCost(
        forward,
        backward,
        gradients,
        parameters * graph.layers,
        (leaving if checkpointed else saved) * graph.layers,
        (saved if checkpointed else 0.0) * graph.layers,
        dict(plan.strategies),
    )


@dataclass(frozen=True)
class _Candidate:
    """One pipeline to cut: copies, groups, chunks, microbatches, schedule."""

    replicas: int
    groups: int
    chunks: int
    microbatches: int
    schedule: str

    @property
    def stages(self) -> int:
        return self.groups * self.chunks


#: Samples per microbatch the search tries when the microbatch count is not given: one (the
#: least bubble) and a few more (fewer, larger collectives per step).
SAMPLES = (1, 2, 4, 8)


def candidates(spec: Pipeline, devices: int, units: int, batch: int) -> Iterator[_Candidate]:
    """Every pipeline ``spec`` allows on ``devices`` for a graph of ``units`` units and a batch
    of ``batch`` samples: copies and groups powers of two, the interleaved schedule on two or
    more groups with two chunks (its microbatches a multiple of the groups), microbatches of
    :data:`SAMPLES` samples each."""
    for replicas in [spec.replicas] if spec.replicas else _powers(devices):
        for groups in [spec.stages] if spec.stages else _powers(devices // replicas):
            if replicas * groups > devices or devices % (replicas * groups):
                continue
            if batch % replicas:
                continue
            for schedule in [spec.schedule] if spec.schedule else SCHEDULES:
                interleaved = schedule == "interleaved-1f1b"
                if interleaved and groups < 2:
                    continue
                chunks = spec.chunks or (2 if interleaved else 1)
                if groups * chunks > units:
                    continue
                if spec.microbatches:
                    m = spec.microbatches
                    counts = [m] if batch % (replicas * m) == 0 else []
                else:
                    counts = sorted(
                        {batch // (replicas * b) for b in SAMPLES if batch % (replicas * b) == 0},
                        reverse=True,
                    )
                for m in counts:
                    if interleaved and m % groups:
                        continue
                    yield _Candidate(replicas, groups, chunks, m, schedule)


@dataclass(frozen=True)
class Cuts:
    """A pipeline cut into stages: the unit index each stage starts at (and the end), and its
    step time by the schedule's closed form."""

    bounds: tuple[int, ...]
    step: float


@dataclass(frozen=True)
class Memory:
    """What the stages of a chain of units hold, over its cut points ``[a, b]`` (the run of
    units ``a..b-1``): parameter bytes and activation bytes per microbatch in flight, the
    microbatches in flight per stage, the bytes held once more (a checkpointed unit
    recomputing) and the bytes a stage may hold."""

    parameters: np.ndarray
    activations: np.ndarray
    flights: np.ndarray
    buffer: float
    limit: float


def best_cuts(
    times: np.ndarray,
    send: np.ndarray,
    memory: Memory,
    step: Callable[[tuple[int, ...]], float],
    lower: Callable[[float], float],
) -> Cuts | None:
    """The cuts of ``len(send) + 1`` units into ``len(memory.flights)`` runs of least
    ``step(bounds)``.

    ``times[a, b]`` is the time per microbatch of a stage of units ``a..b-1`` (``inf`` where
    ``b <= a``), ``send[i]`` the seconds across the boundary after unit ``i``; stage ``k`` fits
    when ``parameters + flights[k] * activations + buffer <= limit``. For each bound on the
    stages' times, from the least any cuts meet, the dynamic programme finds the cuts of least
    total time (stage times and sends) meeting it; ``lower(bound)`` is the least step any cuts
    under that bound can take, which ends the sweep."""
    n = times.shape[0] - 1
    if len(memory.flights) > n:
        return None
    chain = (
        np.ascontiguousarray(times, dtype=np.float64),
        # A stage ending at cut point b pays the sends across it, but the last.
        np.concatenate([[0.0], 2 * np.asarray(send, dtype=np.float64), [0.0]]),
        np.ascontiguousarray(memory.parameters, dtype=np.float64),
        np.ascontiguousarray(memory.activations, dtype=np.float64),
        np.ascontiguousarray(memory.flights, dtype=np.float64),
        float(memory.buffer),
        float(memory.limit),
    )
    # The least bound any cuts meet: the min-max programme over the same stages.
    least = least_bottleneck(*chain)
    if not math.isfinite(least):
        return None
    values = np.unique(times[np.isfinite(times)])
    lo = int(np.searchsorted(values, least))
    best: Cuts | None = None
    for bound in values[lo:]:
        if best is not None and lower(bound) >= best.step:
            break
        found = least_cuts(*chain, float(bound))
        if found is not None:
            bounds = tuple(found)
            s = step(bounds)
            if best is None or s < best.step:
                best = Cuts(bounds, s)
    return best


def search_pipeline(
    graph: Graph,
    cluster: Cluster,
    pricing: Pricing,
    spec: Pipeline,
    memory_limit: float | None = None,
) -> PipelineResult:
    """The pipelined plan of least step time for ``graph`` on ``cluster`` (the module
    docstring); ``spec`` fixes any of the pipeline's fields. :class:`InfeasibleError` when no
    pipeline fits in memory."""
    t0 = time.perf_counter()
    if not isinstance(spec, Pipeline):
        raise TypeError(
            f"search: pipeline must be a bool or a taps.Pipeline, got {type(spec).__name__}"
        )
    limit = memory_limit if memory_limit is not None else cluster.device_memory
    limit = math.inf if limit is None else float(limit)
    work = _Units(graph, cluster, pricing, limit)
    n = len(work.units)
    devices = cluster.num_devices
    if spec.stages is not None and spec.stages * (spec.replicas or 1) > devices:
        raise ArgumentError(
            f"search: {spec.stages} stage(s) x {spec.replicas or 1} copies need more than the "
            f"cluster's {devices} devices"
        )
    if spec.stages is not None and spec.stages * (spec.chunks or 1) > n:
        raise ArgumentError(
            f"search: {spec.stages * (spec.chunks or 1)} stage(s) for graph {graph.name!r}, "
            f"which cuts into {n} unit(s) at most"
        )
    if pricing.checkpoint > 1:
        raise ArgumentError(
            "search: a pipeline checkpoints every layer or none (checkpoint 1 or 0), got "
            f"checkpoint {pricing.checkpoint}"
        )
    batch = batch_of(graph)
    if next(candidates(spec, devices, n, batch), None) is None:
        raise ArgumentError(
            f"search: no pipeline of {spec} on {devices} devices for graph {graph.name!r} (a "
            f"batch of {batch}, {n} unit(s))"
        )
    best: tuple[float, _Candidate, Cuts, list[UnitCost]] | None = None
    by_schedule: dict[str, float | None] = {s: None for s in SCHEDULES}
    for wide in (False, True):
        # Stages inside a node first; stages of whole nodes only when none of those fits.
        for lower, c, size, parts in _bounded(work, spec, devices, batch, wide):
            old = by_schedule[c.schedule]
            if best is not None and lower >= best[0]:
                continue  # no cut of it can beat the best found
            found = None
            # Each unit is first planned within the whole device; if its stages then do not
            # fit, again within its even share of it.
            for share in sorted({1, math.ceil(n / c.stages)}):
                chain = work.chain(size, parts, share)
                if chain is None:
                    continue
                known = chain.costs
                found = _cut(cluster, pricing, c, chain, limit)
                if found is not None:
                    break
            if found is None:
                continue
            step = float(found.step)
            by_schedule[c.schedule] = step if old is None else min(old, step)
            if best is None or found.step < best[0]:
                best = (found.step, c, found, known)
        if best is not None:
            break
    if best is None:
        raise InfeasibleError(
            f"no pipeline of graph {graph.name!r} fits in {limit:,.0f} bytes per device on "
            f"{devices:,} devices"
        )
    _, chosen, cuts, chosen_costs = best
    plan, step, memory = _plan(work, cluster, pricing, chosen, cuts, chosen_costs)
    return PipelineResult(plan, step, memory, work.searches, time.perf_counter() - t0, by_schedule)


def _bounded(
    work: _Units, spec: Pipeline, devices: int, batch: int, wide: bool
) -> list[tuple[float, _Candidate, int, int]]:
    """The pipelines :func:`candidates` gives whose groups span whole nodes (``wide``) or lie
    inside one, each with a bound on the step its cuts can take, least first: stages no faster
    than the mean of its units as planned within the whole device, the least sends, nothing
    reduced."""
    n = len(work.units)
    out = []
    sends: dict[tuple[int, int], list[float]] = {}
    for c in candidates(spec, devices, n, batch):
        size = devices // (c.replicas * c.groups)
        if (size > work.cluster.devices_per_node) != wide:
            continue
        parts = c.replicas * c.microbatches
        costs = work.costs(size, parts, 1)
        if costs is None:
            continue
        total = sum(x.forward + x.backward for x in costs)
        m = c.microbatches
        if c.schedule == "interleaved-1f1b":
            lower = m * total / c.groups + (c.groups - 1) * total / c.stages
        else:
            least = 0.0
            if c.stages > 1:
                if (size, parts) not in sends:
                    sends[size, parts] = sorted(float(x) for x in work.sends(size, parts))
                least = sum(sends[size, parts][: c.stages - 1])
            lower = total + (m - 1) * total / c.stages + 2 * least
        out.append((lower, c, size, parts))
    out.sort(key=lambda x: x[0])
    return out


def _stage_numbers(
    costs: Sequence[UnitCost], bounds: Sequence[int]
) -> tuple[list[float], list[float], list[float], list[float], list[float]]:
    """Per stage: forward, backward, gradient reductions, parameter bytes, activation bytes."""
    out: tuple[list[float], ...] = ([], [], [], [], [])
    for a, b in itertools.pairwise(bounds):
        part = costs[a:b]
        for values, field in zip(
            out, ("forward", "backward", "gradients", "parameters", "activations")
        ):
            values.append(sum(getattr(x, field) for x in part))
    return out  # type: ignore[return-value]


def _replica_reduction(cluster: Cluster, pricing: Pricing, replicas: int, elements: float) -> float:
    """Seconds to all_reduce ``elements`` gradient elements per device over the ``replicas``
    copies of the pipeline (ranks ``num_devices / replicas`` apart)."""
    if replicas == 1 or elements == 0:
        return 0.0
    per = cluster.num_devices // replicas
    layout = Layout([per * max(1, round(elements))], [replicas, per], [0])
    dtype = pricing.gradient_bytes or 4
    return cluster.collective_cost(layout, "all_reduce", None, float(dtype))


def _step(
    cluster: Cluster,
    pricing: Pricing,
    c: _Candidate,
    forward: Sequence[float],
    backward: Sequence[float],
    sends: Sequence[float],
    reductions: Sequence[float],
) -> float:
    """The schedule's step time and the slowest stage's gradient reductions after the flush."""
    pipe = step_time(c.schedule, forward, backward, sends, c.microbatches, c.groups)
    return pipe + max(reductions)


def pipeline_step(plan: Plan) -> float:
    """The step time of a pipelined plan from its stages alone: its schedule's (bubble
    included) and the slowest stage's gradient reductions after the flush."""
    p = plan.pipeline
    if p is None or p.schedule is None or p.microbatches is None:
        raise ArgumentError("pipeline_step: the plan has no stages")
    s = plan.stages
    pipe = step_time(
        p.schedule,
        [x.forward for x in s],
        [x.backward for x in s],
        [x.send for x in s],
        p.microbatches,
        p.stages,
    )
    return pipe + max(x.reduction for x in s)


@dataclass(frozen=True)
class _Chain:
    """The units' costs on groups of one size at one microbatch and memory share, as the
    programme over cuts reads them: prefix sums per :class:`UnitCost` field (and of the gradient
    elements), over every run ``a..b`` of units (``[a, b]``) its time per microbatch (``inf``
    unless ``b > a``), parameter and activation bytes, the most a checkpointed unit holds again,
    and the seconds across each unit boundary."""

    costs: list[UnitCost]
    prefix: dict[str, np.ndarray]
    elements: np.ndarray
    times: np.ndarray
    parameters: np.ndarray
    activations: np.ndarray
    buffer: float
    send: np.ndarray

    @classmethod
    def of(cls, costs: list[UnitCost], pricing: Pricing, send: np.ndarray) -> _Chain:
        """The chain of ``costs`` (one per unit), ``send`` its boundaries' seconds."""
        n = len(costs)
        prefix = {
            field: np.concatenate([[0.0], np.cumsum([getattr(x, field) for x in costs])])
            for field in ("forward", "backward", "gradients", "parameters", "activations")
        }
        elements = np.concatenate(
            [[0.0], np.cumsum([_gradient_elements(x, pricing) for x in costs])]
        )

        def span(p: np.ndarray) -> np.ndarray:
            return p[None, :] - p[:, None]

        a_b = np.arange(n + 1)
        valid = a_b[None, :] > a_b[:, None]
        return cls(
            costs,
            prefix,
            elements,
            np.where(valid, span(prefix["forward"]) + span(prefix["backward"]), np.inf),
            span(prefix["parameters"]),
            span(prefix["activations"]),
            max(x.buffer for x in costs),
            send,
        )


def _cut(
    cluster: Cluster, pricing: Pricing, c: _Candidate, chain: _Chain, limit: float
) -> Cuts | None:
    """The best cuts of the units for pipeline ``c`` (``None``: none fits)."""
    n = len(chain.costs)
    prefix, elements = chain.prefix, chain.elements
    flights = np.array(
        [in_flight(c.schedule, k, c.groups, c.chunks, c.microbatches) for k in range(c.stages)]
    )
    held = Memory(
        chain.parameters,
        chain.activations,
        flights,
        chain.buffer,
        limit * (1 if c.chunks == 1 else 1 / c.chunks),
    )
    send = chain.send if c.stages > 1 else np.zeros(n - 1)

    reduced: dict[float, float] = {}

    def over_copies(count: float) -> float:
        if count not in reduced:
            reduced[count] = _replica_reduction(cluster, pricing, c.replicas, count)
        return reduced[count]

    def step(bounds: tuple[int, ...]) -> float:
        at = np.asarray(bounds)
        f, b, g = (np.diff(prefix[x][at]) for x in ("forward", "backward", "gradients"))
        sends = [float(send[e - 1]) for e in bounds[1:-1]] + [0.0]
        counts = np.diff(elements[at])
        reductions = [float(g[k]) + over_copies(float(counts[k])) for k in range(len(g))]
        return _step(cluster, pricing, c, list(f), list(b), sends, reductions)

    total = float(prefix["forward"][-1] + prefix["backward"][-1])
    m = c.microbatches

    def lower(bound: float) -> float:
        if c.schedule == "interleaved-1f1b":
            return m * total / c.groups + (c.groups - 1) * bound
        return total + (m - 1) * bound

    return best_cuts(chain.times, send, held, step, lower)


def _gradient_elements(cost: UnitCost, pricing: Pricing) -> float:
    """Gradient elements per device of a unit: its parameter bytes over what training keeps per
    element (bf16 weights, the graph's usual, priced as 2 bytes)."""
    weight, rest = pricing.parameter_memory(2)
    return cost.parameters / (weight + rest)


def _plan(
    work: _Units,
    cluster: Cluster,
    pricing: Pricing,
    c: _Candidate,
    cuts: Cuts,
    costs: list[UnitCost],
) -> tuple[Plan, float, float]:
    """The pipelined plan of the chosen cuts, each stage priced again whole from its units'
    strategies (:func:`taps.search.evaluate.breakdown`), its step time and most memory."""
    size = cluster.num_devices // (c.replicas * c.groups)
    parts = c.replicas * c.microbatches
    sub = _slice(cluster, size)
    strategies: dict[str, Strategy] = {}
    for u, cost in enumerate(costs):
        strategies.update(zip(work.units[u], cost.strategies.values()))
    priced: dict[tuple[object, ...], UnitCost] = {}
    stages_costs = []
    for a, b in zip(cuts.bounds, cuts.bounds[1:]):
        key = tuple(work.keys[a:b])
        if key not in priced:
            ops = [n for u in work.units[a:b] for n in u]
            graph = microbatched(stage_graph(work.graph, ops), parts)
            p = Plan(graph, sub, {n: strategies[n] for n in ops}, pricing)
            rows = breakdown(p)
            # In flight, each unit keeps its own; checkpointed, one unit recomputes at a time.
            whole = replace(
                _unit_cost(p, rows),
                activations=sum(x.activations for x in costs[a:b]),
                buffer=max(x.buffer for x in costs[a:b]),
            )
            priced[key] = whole
        stages_costs.append(priced[key])
    send = [
        send_seconds(cluster, size, work.crossing[b - 1] / parts) for b in cuts.bounds[1:-1]
    ] + [0.0]
    reductions = [
        x.gradients
        + _replica_reduction(cluster, pricing, c.replicas, _gradient_elements(x, pricing))
        for x in stages_costs
    ]
    stages = []
    for k, ((a, b), x) in enumerate(zip(zip(cuts.bounds, cuts.bounds[1:]), stages_costs)):
        flight = in_flight(c.schedule, k, c.groups, c.chunks, c.microbatches)
        group = k % c.groups
        stages.append(
            Stage(
                index=k,
                group=group,
                operators=tuple(n for u in work.units[a:b] for n in u),
                first_device=group * size,
                cluster=sub,
                forward=x.forward,
                backward=x.backward,
                send=send[k],
                memory=x.parameters + flight * x.activations + x.buffer,
                in_flight=flight,
                reduction=reductions[k],
                graph=work.graph,
            )
        )
    chosen = Pipeline(c.groups, c.microbatches, c.schedule, c.replicas, c.chunks)
    plan = Plan(work.graph, cluster, strategies, pricing, tuple(stages), chosen)
    return plan, pipeline_step(plan), max(s.memory for s in stages)
