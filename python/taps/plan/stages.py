"""Pipeline stages: the inter-operator half of a plan (docs/pipeline.md).

A pipelined plan cuts the graph, in its operator order, into stages. The cluster holds
``replicas`` data-parallel copies of the whole pipeline, each on a contiguous slice of
``cluster.num_devices / replicas`` devices; inside a copy, device group ``g`` (of ``stages``
groups, all of one shape) is the contiguous slice ``[g * size, (g + 1) * size)``, a slice of
whole nodes or of one node's devices. Group ``g`` runs stage ``g`` (and, with the interleaved
schedule's ``chunks`` per group, stages ``g + stages``, ``g + 2 * stages``, ...). Each stage is
planned by taps' intra-operator search over its sub-graph (:func:`stage_graph`: the stage's
operators, the tensors earlier stages make become its inputs) at the microbatch's batch
(:func:`microbatched`) on its sub-cluster.

:class:`Pipeline` is what a search is asked (any field left ``None`` is searched) and, with every
field set, what it chose; :class:`Stage` is one stage of the choice; :func:`locate` maps a global
rank to its copy, group, stages and rank inside them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from taps._core import Cluster
from taps._support.arguments import shown
from taps.errors import ArgumentError, GraphError
from taps.graph import Graph
from taps.graph.records import is_positive_int

#: The schedules a pipeline may run, in the order the search tries them.
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


def _count(where: str, name: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be an int or None, got {type(value).__name__}")
    if not is_positive_int(value):
        raise ArgumentError(f"{where}: {name} must be positive and below 2**63, got {shown(value)}")


def _power_of_two(where: str, name: str, value: int | None) -> None:
    if value is not None and value & (value - 1):
        raise ArgumentError(f"{where}: {name} must be a power of two (a device count), got {value}")


@dataclass(frozen=True)
class Pipeline:
    """A pipeline: asked of the search with any field ``None`` (searched), or chosen by it with
    every field set.

    Attributes:
        stages: device groups the pipeline runs on, one after the other (its pipeline degree); a
            power of two, as the groups' devices are.
        microbatches: microbatches per step per copy of the pipeline; the batch is split evenly.
        schedule: one of :data:`SCHEDULES`: ``"gpipe"`` (every forward, then every backward),
            ``"1f1b"`` (one forward, one backward in turn after a warm-up), ``"interleaved-1f1b"``
            (1F1B over ``chunks`` stages per group).
        replicas: data-parallel copies of the whole pipeline (a power of two); their gradients are
            reduced after the pipeline's flush.
        chunks: stages per device group (the interleaved schedule's virtual stages; 1 for the
            others).
    """

    stages: int | None = None
    microbatches: int | None = None
    schedule: str | None = None
    replicas: int | None = None
    chunks: int | None = None

    def __post_init__(self) -> None:
        for name in ("stages", "microbatches", "replicas", "chunks"):
            _count("Pipeline", name, getattr(self, name))
        for name in ("stages", "replicas"):
            _power_of_two("Pipeline", name, getattr(self, name))
        if self.schedule is not None and self.schedule not in SCHEDULES:
            raise ArgumentError(
                f"Pipeline: schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )
        if self.chunks is not None and self.chunks > 1 and self.schedule in ("gpipe", "1f1b"):
            raise ArgumentError(
                f"Pipeline: chunks={self.chunks} needs the interleaved-1f1b schedule, not "
                f"{self.schedule}"
            )

    @property
    def resolved(self) -> bool:
        """Whether every field is set (a chosen pipeline)."""
        return None not in (
            self.stages,
            self.microbatches,
            self.schedule,
            self.replicas,
            self.chunks,
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON object."""
        return {
            "stages": self.stages,
            "microbatches": self.microbatches,
            "schedule": self.schedule,
            "replicas": self.replicas,
            "chunks": self.chunks,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Pipeline:
        """The pipeline of :meth:`to_dict`'s object."""
        if not isinstance(data, dict):
            raise TypeError("a pipeline must be a JSON object")
        return cls(**{k: data[k] for k in cls().to_dict()})


@dataclass(frozen=True)
class Stage:
    """One stage of a pipelined plan, of its first copy (the other copies repeat it
    ``cluster.num_devices / replicas`` ranks further on).

    Attributes:
        index: its place in the pipeline, 0 first.
        group: the device group that runs it (``index % stages``).
        operators: its operators' names, in the graph's order.
        first_device: the global rank of its group's first device in the first copy.
        cluster: its sub-cluster: the group's devices with the whole cluster's links (a slice of
            whole nodes, or a node's devices).
        forward: seconds of its forward on one microbatch (compute and communication inside it).
        backward: seconds of its backward on one microbatch.
        send: seconds to send its output activations of one microbatch to the next stage (and as
            long for their gradients back); 0 for the last.
        memory: bytes per device at its peak: its parameters and what training keeps of them,
            and the activations of ``in_flight`` microbatches (checkpointed: what leaves each
            layer, and one layer's saved outputs again while it recomputes).
        in_flight: microbatches whose activations it holds at once under the schedule (a
            fraction under the interleaved schedule: its share of its group's).
        reduction: seconds of its parameters' gradient reductions once per step, after the
            pipeline's flush: inside its group and over the copies of the pipeline.
        graph: the graph its times and memory were priced on (a plan of these stages must be
            of it, or of an equal graph); ``None`` for a stage made by hand (not checked).
    """

    index: int
    group: int
    operators: tuple[str, ...]
    first_device: int
    cluster: Cluster
    forward: float
    backward: float
    send: float
    memory: float
    in_flight: float
    reduction: float = 0.0
    graph: Graph | None = field(default=None, compare=False, repr=False)

    @property
    def devices(self) -> int:
        """Devices in its group."""
        return self.cluster.num_devices

    @property
    def ranks(self) -> range:
        """Its group's global ranks in the first copy."""
        return range(self.first_device, self.first_device + self.devices)

    def to_dict(self) -> dict[str, Any]:
        """The stage as a JSON object (its sub-cluster as its nodes and devices per node: the
        links are the whole cluster's)."""
        return {
            "index": self.index,
            "group": self.group,
            "operators": list(self.operators),
            "first_device": self.first_device,
            "nodes": self.cluster.nodes,
            "devices_per_node": self.cluster.devices_per_node,
            "forward": self.forward,
            "backward": self.backward,
            "send": self.send,
            "memory": self.memory,
            "in_flight": self.in_flight,
            "reduction": self.reduction,
        }

    @classmethod
    def from_dict(cls, data: Any, whole: Cluster, graph: Graph | None = None) -> Stage:
        """The stage of :meth:`to_dict`'s object, its sub-cluster cut from ``whole``, priced on
        ``graph``."""
        if not isinstance(data, dict):
            raise TypeError("a stage must be a JSON object")
        return cls(
            index=int(data["index"]),
            group=int(data["group"]),
            operators=tuple(str(n) for n in data["operators"]),
            first_device=int(data["first_device"]),
            cluster=sub_cluster(whole, int(data["nodes"]), int(data["devices_per_node"])),
            forward=float(data["forward"]),
            backward=float(data["backward"]),
            send=float(data["send"]),
            memory=float(data["memory"]),
            in_flight=float(data["in_flight"]),
            reduction=float(data["reduction"]),
            graph=graph,
        )


def sub_cluster(cluster: Cluster, nodes: int, devices_per_node: int) -> Cluster:
    """The cluster of ``nodes`` of ``cluster``'s nodes (``devices_per_node`` all of a node's), or
    of ``devices_per_node`` devices of one node (``nodes`` 1): the same links, latencies, device
    and memory."""
    whole = cluster.devices_per_node
    if nodes < 1 or devices_per_node < 1 or devices_per_node & (devices_per_node - 1):
        raise ArgumentError(
            f"a sub-cluster of {nodes} node(s) x {devices_per_node} device(s) is no slice"
        )
    if (
        nodes > cluster.nodes
        or devices_per_node > whole
        or (nodes > 1 and devices_per_node < whole)
    ):
        raise ArgumentError(
            f"a sub-cluster of {nodes} node(s) x {devices_per_node} device(s) is no slice of "
            f"{cluster.nodes} node(s) x {whole}"
        )
    memory = cluster.device_memory
    limit = math.inf if memory is None else memory
    levels = cluster.levels
    if devices_per_node < whole:
        levels = [(devices_per_node, *levels[0][1:])]
        return Cluster.hierarchy(levels, limit, cluster.replicas, cluster.device.name)
    return Cluster.hierarchy(levels, limit, cluster.replicas, cluster.device.name, nodes=nodes)


@dataclass(frozen=True)
class Place:
    """Where a global rank works in a pipelined plan: its data-parallel copy, its device group,
    the stages that group runs (one, or the interleaved schedule's chunks) and its rank inside
    the group (the rank its stages' intra-operator plans give it)."""

    replica: int
    group: int
    stages: tuple[int, ...]
    rank: int


def locate(stages: Sequence[Stage], pipeline: Pipeline, rank: int) -> Place:
    """The :class:`Place` of global ``rank`` in a plan of ``stages`` under the chosen
    ``pipeline`` (every field set) on ``num_devices = replicas * stages * group size``
    devices."""
    if not stages or not pipeline.resolved:
        raise ArgumentError("locate: needs a pipelined plan's stages and its chosen pipeline")
    assert pipeline.stages is not None and pipeline.replicas is not None
    size = stages[0].devices
    per_copy = size * pipeline.stages
    total = per_copy * pipeline.replicas
    if not isinstance(rank, int) or not 0 <= rank < total:
        raise ArgumentError(f"locate: rank must be in 0..{total - 1}, got {rank!r}")
    replica, local = divmod(rank, per_copy)
    group, inside = divmod(local, size)
    return Place(replica, group, tuple(s.index for s in stages if s.group == group), inside)


def stage_graph(graph: Graph, operators: Sequence[str], name: str | None = None) -> Graph:
    """The sub-graph of ``operators`` (in ``graph``'s order): their parameters, inputs and views,
    and every tensor an operator outside them makes, read by one of them, as an input (with the
    gradient its producer's stage needs back, ``requires_grad``, as it had). Ties among the
    operators are kept where every instance of them is in (each tie trimmed to those
    instances)."""
    chosen = set(operators)
    known = {op.name for op in graph.ops}
    unknown = [n for n in operators if n not in known]
    if unknown:
        raise GraphError(f"stage_graph: graph {graph.name!r} has no operator {unknown[0]!r}")
    sub = Graph(name=name or graph.name, layers=graph.layers)
    made: dict[str, str] = {}  # tensor of graph -> its name in sub

    def bring(tensor: str) -> str:
        if tensor in made:
            return made[tensor]
        t = graph.tensors[tensor]
        if t.kind == "view":
            assert t.base is not None
            base = bring(t.base)
            made[tensor] = sub.reshape(tensor, base, t.shape).name
        elif t.kind == "parameter":
            made[tensor] = sub.parameter(tensor, t.shape, t.dtype_bytes, t.requires_grad).name
        else:  # a graph input, or an activation of an operator outside the stage
            made[tensor] = sub.input(tensor, t.shape, t.dtype_bytes, t.requires_grad).name
        return made[tensor]

    for op in graph.ops:
        if op.name not in chosen:
            continue
        operands = [(bring(o.tensor), o.dims) for o in op.inputs]
        n = sum(not o.addend for o in op.inputs)
        out = sub.add_operator(
            op.name,
            op.kind,
            operands[:n],
            op.output.dims,
            partitionable=op.partitionable,
            axis_sizes=dict(zip(op.axes, op.axis_sizes)),
            dtype_bytes=graph.tensors[op.output.tensor].dtype_bytes,
            axis_order=op.axes,
            addends=operands[n:],
            saved=op.saved,
        )
        made[op.output.tensor] = out.name
    for tie in graph.tied:
        inside = [inst for inst in tie if set(inst) <= chosen]
        if len(inside) >= 2:
            sub.tie(inside)
    return sub


def _follow(graph: Graph, sources: set[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The batch followed from the leading dim of the graph inputs ``sources``: the batched dim
    of every tensor that holds it, and (operator, axis) of every operator axis that indexes it.
    An axis that indexes a batched dim of an operand is the batch, and so is the output dim it
    indexes; a view of a batched tensor carries it in its leading dim."""
    tensors: dict[str, int] = {}  # tensor name -> its batched dim
    axes: list[tuple[str, str]] = []

    def batched(name: str) -> int | None:
        if name not in tensors:
            t = graph.tensors[name]
            if name in sources or (
                t.kind == "view" and t.base is not None and batched(t.base) is not None
            ):
                tensors[name] = 0
        return tensors.get(name)

    for op in graph.ops:
        found: set[str] = set()
        for o in op.inputs:
            d = batched(o.tensor)
            if d is not None:
                found.add(o.dims[d])
        axes += [(op.name, a) for a in op.axes if a in found]
        out = [i for i, d in enumerate(op.output.dims) if d in found]
        if out:
            tensors[op.output.tensor] = out[0]
    for name, t in graph.tensors.items():  # views no operator reads (a model's output)
        if t.kind == "view":
            batched(name)
    return tensors, axes


def _batch_dims(graph: Graph) -> tuple[list[tuple[str, int]], list[tuple[str, str]]]:
    """Where the batch lies: (tensor, dim) of every graph input and view that holds it, and
    (operator, axis) of every operator axis that indexes it (:func:`microbatched`). The inputs
    that carry the batch are those whose leading dim, followed through the operators, reaches
    the leading dim of one of the graph's outputs (a tensor no operator reads): a model's token
    ids or an earlier stage's activations, not a table of positions broadcast over the batch
    (GPT-2's position ids, of leading dim 1 where they meet the tokens). When no input reaches
    an output so (a graph ending in a loss), every input carries it."""
    inputs = [n for n, t in graph.tensors.items() if t.kind == "input"]
    read = {o.tensor for op in graph.ops for o in op.inputs}
    read |= {t.base for t in graph.tensors.values() if t.kind == "view" and t.base is not None}
    outputs = [
        n for n, t in graph.tensors.items() if t.kind in ("activation", "view") and n not in read
    ]
    carrying = {
        name for name in inputs if any(_follow(graph, {name})[0].get(o) == 0 for o in outputs)
    }
    tensors, axes = _follow(graph, carrying or set(inputs))
    stored = [(n, d) for n, d in tensors.items() if graph.tensors[n].kind in ("input", "view")]
    return stored, axes


def batch_of(graph: Graph) -> int:
    """The most microbatches ``graph``'s batch splits into (:func:`microbatched`): the greatest
    common divisor of the sizes that hold it."""
    stored, axes = _batch_dims(graph)
    sizes = [graph.tensors[n].shape[d] for n, d in stored]
    sizes += [graph.op(o).axis_size(a) for o, a in axes]
    return math.gcd(*sizes) if sizes else 1


def microbatched(graph: Graph, microbatches: int) -> Graph:
    """``graph`` on a microbatch: its batch divided by ``microbatches``. The batch is the leading
    dim of the graph inputs that carry it (:func:`_batch_dims`: those whose leading dim reaches
    an output's; the others, such as a table of positions broadcast over the batch, stay
    whole); it follows the operators' axes (an axis that indexes a batched dim is the batch) to
    their outputs, and a view of a batched tensor carries it in its leading dim. A batch that
    does not split so is a :class:`GraphError`."""
    _count("microbatched", "microbatches", microbatches)
    if microbatches == 1:
        return graph
    whole = batch_of(graph)
    if whole % microbatches:
        raise GraphError(
            f"graph {graph.name!r}: its batch (splitting into {whole} at most) does not split "
            f"into {microbatches} microbatches"
        )
    stored, axes = _batch_dims(graph)
    doc = graph.to_dict()
    tensors = {t["name"]: t for t in doc["tensors"]}
    for name, d in stored:
        tensors[name]["shape"][d] //= microbatches
    split: dict[str, set[str]] = {}
    for o, a in axes:
        split.setdefault(o, set()).add(a)
    for entry in doc["ops"]:
        for pair in entry["axes"]:
            if pair[0] in split.get(entry["name"], ()):
                pair[1] //= microbatches
    return Graph.from_dict(doc)
