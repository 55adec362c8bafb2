"""The plan: a strategy for every operator of a graph on a cluster, and how it is priced.

A :class:`Plan` is the value the rest of taps passes around: the search returns one
(``taps.search(...).plan``), :func:`taps.evaluate` and :func:`taps.breakdown` price one, the exports
put one on a framework's mesh and the verifiers run one. It is checked when it is made (every
operator of the graph has exactly one strategy that fits it and the cluster, and no other name
has one), and it is saved and read back exactly (:meth:`Plan.to_json`, :meth:`Plan.from_json`;
docs/plan.md gives the file format). A pipelined plan (docs/pipeline.md) also holds its stages
(:class:`taps.plan.stages.Stage`) and the pipeline chosen; each operator's strategy then spans its
stage's devices, and :attr:`Plan.stage_plans` gives every stage's own plan.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from os import PathLike
from pathlib import Path
from types import MappingProxyType
from typing import Any

from taps._core import Cluster, Strategy
from taps._support import arguments
from taps._support.arguments import instance, some
from taps._support.outputs import Outputs
from taps.errors import GraphError, PlanFileError, StrategyError, TapsError
from taps.graph import Graph
from taps.plan.candidates import Candidate
from taps.plan.pricing import Pricing
from taps.plan.stages import Pipeline, Stage, microbatched, stage_graph

#: What the ``format`` key of a saved plan says, and the version this taps writes and reads.
FORMAT = "taps.plan"
VERSION = 3


@dataclass(frozen=True, eq=False)
class Plan:
    """A strategy for every operator of ``graph`` on ``cluster``, priced by ``pricing``.

    Attributes:
        graph: the model's graph.
        cluster: the cluster the strategies place the operators on.
        strategies: operator name -> its strategy, in the graph's operator order (read-only).
        pricing: how the plan is priced (cost model, step, planner, ZeRO, what training keeps
            per parameter).
        stages: a pipelined plan's stages, in pipeline order (empty: not pipelined); every
            operator's strategy then spans its stage's sub-cluster.
        pipeline: the pipeline chosen, every field set (``None``: not pipelined).
    """

    graph: Graph
    cluster: Cluster
    strategies: Mapping[str, Strategy]
    pricing: Pricing = field(default_factory=Pricing)
    stages: tuple[Stage, ...] = ()
    pipeline: Pipeline | None = None

    def __post_init__(self) -> None:
        for name, kind in (("graph", Graph), ("cluster", Cluster), ("pricing", Pricing)):
            instance("Plan", name, getattr(self, name), kind)
        if not isinstance(self.strategies, Mapping):
            raise TypeError(
                "Plan: strategies must map operator names to taps.Strategy, got "
                f"{type(self.strategies).__name__}"
            )
        if not isinstance(self.stages, (tuple, list)):
            raise TypeError(
                f"Plan: stages must be a tuple of taps.Stage, got {type(self.stages).__name__}"
            )
        if self.pipeline is not None:
            instance("Plan", "pipeline", self.pipeline, Pipeline)
        object.__setattr__(self, "stages", tuple(self.stages))
        devices = _stage_devices(self.graph, self.cluster, self.stages, self.pipeline)
        ordered = _checked(self.graph, self.cluster, self.strategies, devices)
        object.__setattr__(self, "strategies", MappingProxyType(ordered))
        sharded = self.pricing.fsdp if isinstance(self.pricing.fsdp, tuple) else ()
        if foreign := [n for n in sharded if n not in ordered]:
            raise GraphError(
                f"fsdp names operators graph {self.graph.name!r} does not have: {some(foreign)}"
            )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return (
            self.cluster == other.cluster
            and self.pricing == other.pricing
            and dict(self.strategies) == dict(other.strategies)
            and self.stages == other.stages
            and self.pipeline == other.pipeline
            and same_graph(self.graph, other.graph)
        )

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[type[Plan], tuple[Any, ...]]:
        # The strategies' read-only view does not pickle; the plan is made (and checked) again.
        return (
            Plan,
            (
                self.graph,
                self.cluster,
                dict(self.strategies),
                self.pricing,
                self.stages,
                self.pipeline,
            ),
        )

    @cached_property
    def candidates(self) -> Mapping[str, Candidate]:
        """Every operator's candidate: the layout its strategy gives each operand, worked out
        once for the plan (pricing, exports and verifiers all read them)."""
        return MappingProxyType(
            {op.name: Candidate.of(op, self.strategies[op.name]) for op in self.graph.ops}
        )

    def with_pricing(self, pricing: Pricing) -> Plan:
        """The same strategies (and stages) priced another way."""
        return Plan(
            self.graph, self.cluster, dict(self.strategies), pricing, self.stages, self.pipeline
        )

    @cached_property
    def stage_plans(self) -> tuple[Plan, ...]:
        """A pipelined plan's stages as plans of their own, in pipeline order: each stage's
        sub-graph (:func:`taps.plan.stages.stage_graph`; the tensors crossing into it hold the
        batch in their leading dim) on a microbatch
        (:func:`taps.plan.stages.microbatched`), its sub-cluster and its operators' strategies,
        under this plan's pricing; empty for a plan without stages."""
        if self.pipeline is None:
            return ()
        assert self.pipeline.replicas is not None and self.pipeline.microbatches is not None
        parts = self.pipeline.replicas * self.pipeline.microbatches
        return tuple(
            Plan(
                microbatched(
                    stage_graph(self.graph, s.operators, f"{self.graph.name} stage {s.index}"),
                    parts,
                ),
                s.cluster,
                {n: self.strategies[n] for n in s.operators},
                self.pricing,
            )
            for s in self.stages
        )

    # -- saved plans ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The plan as a JSON object (docs/plan.md)."""
        graph = self.graph.to_dict()
        return {
            "format": FORMAT,
            "version": VERSION,
            "graph_digest": _digest(graph),
            "cluster": _cluster_dict(self.cluster),
            "pricing": self.pricing.to_dict(),
            "pipeline": None if self.pipeline is None else self.pipeline.to_dict(),
            "stages": [s.to_dict() for s in self.stages],
            "strategies": {
                name: {
                    "degrees": s.degrees,
                    "device_map": s.device_map,
                    "device_matrix": s.device_matrix,
                }
                for name, s in self.strategies.items()
            },
            "graph": graph,
        }

    def to_json(self) -> str:
        """The plan as JSON text, a line per strategy and the graph as :meth:`Graph.to_json`
        writes it (so files diff well); :meth:`from_json` reads it back to an equal plan."""
        doc = self.to_dict()
        lines = ["{"]
        for key in ("format", "version", "graph_digest", "cluster", "pricing", "pipeline"):
            lines.append(f" {json.dumps(key)}: {json.dumps(doc[key], allow_nan=False)},")
        rows = [f"  {json.dumps(s, allow_nan=False)}" for s in doc["stages"]]
        lines += [' "stages": [', ",\n".join(rows), " ],"] if rows else [' "stages": [],']
        rows = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in doc["strategies"].items()]
        lines += [' "strategies": {', ",\n".join(rows), " },"]
        lines.append(' "graph": ' + self.graph.to_json().rstrip("\n").replace("\n", "\n "))
        lines.append("}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_dict(cls, data: Any, graph: Graph | None = None) -> Plan:
        """The plan of :meth:`to_dict`'s object. With ``graph``, the saved graph must be that
        graph. A document of another format or version, or whose graph does not match its
        digest or its strategies, is a :class:`PlanFileError`."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise PlanFileError('not a saved taps plan (no "format": "taps.plan")')
        version = data.get("version")
        if version != VERSION:
            raise PlanFileError(
                f"a plan of format version {version!r}: this taps reads version {VERSION}"
            )
        missing = [
            k
            for k in (
                "graph",
                "graph_digest",
                "cluster",
                "pricing",
                "pipeline",
                "stages",
                "strategies",
            )
            if k not in data
        ]
        if missing:
            raise PlanFileError(f"the plan has no {', '.join(missing)}")
        if _digest(data["graph"]) != data["graph_digest"]:
            raise PlanFileError("the plan's graph was changed after it was saved (digest differs)")
        if graph is not None:
            instance("Plan.from_dict", "graph", graph, Graph)
        try:
            saved = Graph.from_dict(data["graph"])
            if graph is not None and not same_graph(graph, saved):
                raise PlanFileError(
                    f"the plan is of graph {saved.name!r}, which is not the graph "
                    f"{graph.name!r} given"
                )
            strategies = {
                name: Strategy(s["degrees"], s["device_map"], s["device_matrix"])
                for name, s in _object(data["strategies"], "strategies").items()
            }
            cluster = _cluster_of(data["cluster"])
            pipeline = data["pipeline"]
            stages = data["stages"]
            if not isinstance(stages, list):
                raise PlanFileError("the plan's stages must be a JSON list")
            return cls(
                saved,
                cluster,
                strategies,
                Pricing.from_dict(data["pricing"]),
                tuple(Stage.from_dict(s, cluster, saved) for s in stages),
                None if pipeline is None else Pipeline.from_dict(pipeline),
            )
        except PlanFileError:
            raise
        except (TapsError, KeyError, TypeError, ValueError, OverflowError) as e:
            # ValueError and OverflowError: the core's conversions of a malformed or too large
            # value (a level that is not three numbers, a size beyond 64 bits).
            detail = f"missing key {e}" if isinstance(e, KeyError) else " ".join(str(e).split())
            raise PlanFileError(f"the saved plan does not hold together: {detail}") from None

    @classmethod
    def from_json(cls, text: str | bytes, graph: Graph | None = None) -> Plan:
        """Read a plan written by :meth:`to_json`; see :meth:`from_dict`."""
        arguments.text("Plan.from_json", "text", text)
        try:
            data = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PlanFileError(f"not a saved taps plan: not JSON ({e})") from None
        except RecursionError:
            raise PlanFileError("not a saved taps plan: JSON nested too deeply") from None
        except ValueError:  # an int literal longer than Python converts (4,300 digits)
            raise PlanFileError(
                "not a saved taps plan: JSON holds a number too long to read"
            ) from None
        return cls.from_dict(data, graph)

    def save(self, path: str | Path) -> None:
        """Write :meth:`to_json` to ``path``, whole or not at all."""
        if not isinstance(path, (str, PathLike)):
            raise TypeError(f"Plan.save: path must be a str or a path, got {type(path).__name__}")
        with Outputs(path) as out:
            out[path].write_text(self.to_json())
            out.commit()

    @classmethod
    def load(cls, path: str | Path, graph: Graph | None = None) -> Plan:
        """Read a plan saved by :meth:`save`."""
        if not isinstance(path, (str, PathLike)):
            raise TypeError(f"Plan.load: path must be a str or a path, got {type(path).__name__}")
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise PlanFileError(f"cannot read plan {str(path)!r}: {e.strerror}") from None
        try:
            return cls.from_json(data, graph)
        except PlanFileError as e:
            raise PlanFileError(f"{path}: {e}") from None


def same_graph(a: Graph, b: Graph) -> bool:
    """Whether two graphs are the same graph: equal JSON forms once each is read back (a graph
    read from JSON lists its inputs and parameters before the views its operators' outputs
    have, whatever order it was built in)."""
    if a is b:
        return True
    canonical = [Graph.from_dict(g.to_dict()).to_dict() for g in (a, b)]
    return canonical[0] == canonical[1]


def unlike_names(planned: Iterable[str], made: Iterable[str]) -> str | None:
    """The operator names in one set and not the other, in a few words; ``None`` when equal."""
    odd = sorted(set(planned) ^ set(made))
    return f"operators {odd[:5]} are in one and not the other" if odd else None


def unlike_operators(planned: Graph, made: Graph) -> str | None:
    """How ``made`` (the graph a front end makes of a module now) is not a plan's graph
    ``planned`` operator for operator, in a few words: operators in one and not the other, or the
    first whose kind or axes (sizes included: a module called on another batch makes the same
    names) differ; ``None`` when alike. Tensor names may differ (a stage module names its inputs
    as the module does)."""
    odd = unlike_names([op.name for op in planned.ops], [op.name for op in made.ops])
    if odd:
        return odd
    for a, b in zip(planned.ops, made.ops):
        if a.name != b.name:
            return f"operator {a.name!r} comes where {b.name!r} does"
        if a.kind != b.kind:
            return f"operator {a.name!r} is {a.kind} in the plan, {b.kind} here"
        # Size-1 axes split nothing (a stage module that takes a broadcast table as an input
        # rather than a buffer has more of them).
        sizes = [{x: n for x, n in zip(op.axes, op.axis_sizes) if n > 1} for op in (a, b)]
        if sizes[0] != sizes[1]:
            return (
                f"operator {a.name!r} has axes {sizes[0]} in the plan, {sizes[1]} here (another "
                "batch or configuration?)"
            )
    return None


def is_saved_plan(data: Any) -> bool:
    """Whether a JSON document is a saved plan (rather than, say, a graph)."""
    return isinstance(data, dict) and data.get("format") == FORMAT


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PlanFileError(f"the plan's {what} must be a JSON object")
    return value


def _digest(graph: Any) -> str:
    """A digest of the graph's JSON object, so that a hand-edited graph is noticed."""
    text = json.dumps(graph, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _cluster_dict(cluster: Cluster) -> dict[str, Any]:
    """The cluster as JSON: ``device_memory`` null is no limit (JSON has no infinity)."""
    return {
        "levels": [list(level) for level in cluster.levels],
        "device": cluster.device.name,
        "device_memory": cluster.device_memory,
        "replicas": cluster.replicas,
    }


def _cluster_of(data: Any) -> Cluster:
    data = _object(data, "cluster")
    levels = [tuple(level) for level in data["levels"]]
    memory = data["device_memory"]
    return Cluster.hierarchy(
        levels, math.inf if memory is None else memory, data["replicas"], data["device"]
    )


def _stage_devices(
    graph: Graph, cluster: Cluster, stages: tuple[Stage, ...], pipeline: Pipeline | None
) -> dict[str, int]:
    """Per operator of a pipelined plan, the devices its strategy spans (its stage's); empty
    without stages. The stages must cut the graph's operators in order, one after the other, and
    fill the cluster's devices as ``pipeline`` (every field set) lays them out."""
    if pipeline is None and not stages:
        return {}
    if pipeline is None or not pipeline.resolved or not stages:
        raise StrategyError("a pipelined plan needs its stages and its chosen pipeline, both")
    for s in stages:
        if not isinstance(s, Stage):
            raise TypeError(f"Plan: stages must be taps.Stage, got {type(s).__name__}")
    # A stage's times and memory are its graph's: another graph's (one of another batch may
    # have the same name and operators) would price this plan wrongly.
    same = {id(graph)}
    for s in stages:
        if s.graph is None or id(s.graph) in same:
            continue
        if not same_graph(s.graph, graph):
            raise GraphError(
                f"Plan: stage {s.index} was priced on another graph {s.graph.name!r}, not on "
                f"graph {graph.name!r} given: search this graph's pipeline"
            )
        same.add(id(s.graph))
    assert pipeline.stages is not None and pipeline.chunks is not None
    assert pipeline.replicas is not None
    if len(stages) != pipeline.stages * pipeline.chunks:
        raise StrategyError(
            f"the plan has {len(stages)} stage(s); its pipeline {pipeline.stages} group(s) of "
            f"{pipeline.chunks} chunk(s)"
        )
    order = [n for s in stages for n in s.operators]
    if order != [op.name for op in graph.ops]:
        raise StrategyError(
            f"the stages do not cut graph {graph.name!r}'s operators in order, each once"
        )
    size = stages[0].devices
    for i, s in enumerate(stages):
        if (s.index, s.group, s.first_device, s.devices) != (
            i,
            i % pipeline.stages,
            (i % pipeline.stages) * size,
            size,
        ):
            raise StrategyError(
                f"stage {i} is not stage {i} of group {i % pipeline.stages} on devices "
                f"{(i % pipeline.stages) * size}.. ({size} of them)"
            )
    if size * pipeline.stages * pipeline.replicas != cluster.num_devices:
        raise StrategyError(
            f"{pipeline.replicas} copies of {pipeline.stages} group(s) of {size} device(s) are "
            f"not the cluster's {cluster.num_devices}"
        )
    return {n: s.devices for s in stages for n in s.operators}


def _checked(
    graph: Graph,
    cluster: Cluster,
    strategies: Mapping[str, Strategy],
    devices: Mapping[str, int],
) -> dict[str, Strategy]:
    """``strategies`` in the graph's operator order, each checked against its operator and the
    cluster (its stage's ``devices``, in a pipelined plan); names the graph does not have, and
    operators without one, are refused."""
    names = {op.name for op in graph.ops}
    foreign = [n for n in strategies if n not in names]
    if foreign:
        raise GraphError(
            f"strategies for operators graph {graph.name!r} does not have: {some(foreign)}"
        )
    missing = [op.name for op in graph.ops if op.name not in strategies]
    if missing:
        raise StrategyError(
            f"no strategy for {len(missing)} operator(s) of graph {graph.name!r}: {some(missing)}"
        )
    out: dict[str, Strategy] = {}
    for op in graph.ops:
        s = strategies[op.name]
        if not isinstance(s, Strategy):
            raise TypeError(
                f"Plan: the strategy of {op.name!r} must be a taps.Strategy, got {type(s).__name__}"
            )
        sizes = op.partitionable_sizes
        if len(s.degrees) != len(sizes):
            raise StrategyError(
                f"operator {op.name!r}: strategy {s} has {len(s.degrees)} degree(s) for its "
                f"{len(sizes)} partitionable axes ({', '.join(op.partitionable) or 'none'}): "
                "a strategy of another graph?"
            )
        bad = [a for a, d, n in zip(op.partitionable, s.degrees, sizes) if n % d]
        if bad:
            raise StrategyError(
                f"operator {op.name!r}: strategy {s} splits axis {bad[0]!r} of size "
                f"{op.axis_size(bad[0])} into {s.degrees[op.partitionable.index(bad[0])]} blocks"
            )
        want = devices.get(op.name, cluster.num_devices)
        if s.num_devices != want:
            where = "its stage" if op.name in devices else "the cluster"
            raise StrategyError(
                f"operator {op.name!r}: strategy {s} spans {s.num_devices} devices, {where} {want}"
            )
        out[op.name] = s
    return out
