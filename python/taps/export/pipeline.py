"""A pipelined plan (docs/pipeline.md) out to frameworks: the stage split and schedule for
``torch.distributed.pipelining``, each stage's DTensor placements on its own sub-mesh; and for
JAX a mesh and shardings per stage (docs/export.md).

A cut between two stages is a cut between two operators in the graph's order; a torch module is
split at module boundaries. Operator names carry the module path that made them
(:func:`taps.from_torch`), so a cut maps to the outermost module that begins exactly at the
stage's first operator (a ``SplitPoint.BEGINNING``), or else to one that ends exactly at the
previous stage's last operator (``SplitPoint.END``). A cut with neither falls inside a module: an
:class:`ExportError` naming it.

Between stages each rank of a group hands its partner in the next group (the rank with the same
place in its group) its ``1/size`` of every tensor that crosses: the tensor split evenly along its
leading dim (the batch) over the group, as taps prices the send
(:func:`taps.search.pipeline.send_seconds`); the next stage reassembles it on its own mesh.
"""

from __future__ import annotations

import copy
import functools
import math
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from taps._support.extras import require
from taps.errors import ExportError
from taps.export.document import to_text
from taps.export.dtensor import DTensorPlacements
from taps.export.jax import JaxShardings, jax_mesh, named_sharding
from taps.plan.layouts import layouts_of
from taps.plan.plan import Plan, unlike_operators
from taps.plan.stages import Place, Stage, locate

#: torch.distributed.pipelining's schedule class of each taps schedule.
SCHEDULE_CLASSES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
}

FORMAT = "taps.export.pipeline"
VERSION = 1


@dataclass(frozen=True)
class Cut:
    """Where the module is split before stage ``stage``: ``SplitPoint.BEGINNING`` of ``module``
    (``point == "beginning"``) or its ``SplitPoint.END`` (``"end"``)."""

    stage: int
    module: str
    point: str


def _pipelined(plan: Plan) -> tuple[Stage, ...]:
    if not isinstance(plan, Plan):
        raise TypeError(f"a pipeline export needs a taps.Plan, got {type(plan).__name__}")
    if not plan.stages or plan.pipeline is None:
        raise ExportError(
            "the plan has no pipeline stages (search with pipeline=True, or export it with "
            "to_dtensor / to_jax)"
        )
    return plan.stages


def _module_of(op: str, modules: set[str]) -> str:
    """The module path that made operator ``op``: the longest module path its name extends
    (``""``, the root, for an operator the root's own forward makes)."""
    parts = op.split(".")
    for n in range(len(parts), 0, -1):
        path = ".".join(parts[:n])
        if path in modules:
            return path
    return ""


def _ancestors(path: str) -> list[str]:
    """``path`` and the modules holding it, outermost first (the root excluded)."""
    parts = path.split(".") if path else []
    return [".".join(parts[: n + 1]) for n in range(len(parts))]


def split_points(plan: Plan, modules: Iterable[str]) -> tuple[Cut, ...]:
    """The cut before every stage but the first of pipelined ``plan``, as module boundaries of a
    module whose callable submodules are ``modules`` (:func:`module_cuts`)."""
    stages = _pipelined(plan)
    order = [op.name for op in plan.graph.ops]
    index = {name: i for i, name in enumerate(order)}
    return module_cuts(order, [index[s.operators[0]] for s in stages[1:]], modules)


def module_cuts(
    operators: Sequence[str], starts: Sequence[int], modules: Iterable[str]
) -> tuple[Cut, ...]:
    """Where a module is split so that stage ``k + 1`` starts at operator ``starts[k]`` of
    ``operators`` (in order; each named after the module path that made it), given its callable
    submodules ``modules`` (paths as ``named_modules`` gives them; leave out containers that are
    never called, such as ``ModuleList``): per cut, the outermost module whose operators all lie
    in the next stage and begin at its first, else the outermost whose operators all lie in the
    previous stage and end at its last. An :class:`ExportError` names the module a cut falls
    inside."""
    known = set(modules) - {""}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, name in enumerate(operators):
        for m in _ancestors(_module_of(name, known)):
            first.setdefault(m, i)
            last[m] = i
    bounds = [0, *starts, len(operators)]
    out = []
    for k in range(1, len(bounds) - 1):
        begin, start, end = bounds[k - 1], bounds[k], bounds[k + 1]
        after = _ancestors(_module_of(operators[start], known))
        before = _ancestors(_module_of(operators[start - 1], known))
        opening = [m for m in after if first[m] == start and last[m] < end]
        closing = [m for m in before if last[m] == start - 1 and first[m] >= begin]
        if opening:
            out.append(Cut(k, opening[0], "beginning"))
        elif closing:
            out.append(Cut(k, closing[0], "end"))
        else:
            inside = [m for m in after if m in before]
            where = f"module {inside[-1]!r}" if inside else "the root module's own forward"
            raise ExportError(
                f"the cut before stage {k} falls inside {where} (between operators "
                f"{operators[start - 1]!r} and {operators[start]!r}): torch.distributed.pipelining "
                "splits a module only at a submodule's boundary"
            )
    return tuple(out)


def _callable_modules(module: Any) -> list[str]:
    torch = require("torch", "torch", "a pipeline export")
    containers = (torch.nn.ModuleList, torch.nn.ModuleDict)
    return [n for n, m in module.named_modules() if n and not isinstance(m, containers)]


def microbatch(inputs: Sequence[Any], parts: int) -> tuple[Any, ...]:
    """The first of ``parts`` equal chunks of every tensor of ``inputs`` along its leading dim
    (the batch); an :class:`ExportError` when one does not split so."""
    torch = require("torch", "torch", "a pipeline export")
    out = []
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            if x.shape[0] % parts:
                raise ExportError(
                    f"input {i}: its batch {x.shape[0]} does not split into {parts} microbatches"
                )
            x = x[: x.shape[0] // parts]
        out.append(x)
    return tuple(out)


@dataclass(frozen=True)
class Route:
    """What a stage takes, runs and hands on, by the names of the split program's values
    (``torch.distributed.pipelining`` passes a value made by one stage straight to a later one;
    a ``PipelineStage`` hands its outputs to the next stage only, so each stage carries on the
    values later stages read, as its own outputs).

    Attributes:
        received: the values it gets: the microbatch inputs (first stage), else what the
            previous stage carries.
        reads: its stage module's arguments, in order.
        makes: its stage module's outputs, in order.
        carries: the values it hands the next stage (the whole output, for the last).
    """

    received: tuple[str, ...]
    reads: tuple[str, ...]
    makes: tuple[str, ...]
    carries: tuple[str, ...]


def _routes(pipe: Any, inputs: Sequence[Any]) -> tuple[tuple[Route, ...], dict[str, Any]]:
    """Each stage's :class:`Route` through ``pipe``'s split program, and every value of it on
    ``inputs`` (one microbatch; no gradients taken)."""
    torch = require("torch", "torch", "a pipeline export")
    gm = pipe.split_gm
    values: dict[str, Any] = {}

    class Recorder(torch.fx.Interpreter):  # type: ignore[name-defined]
        def run_node(self, n: Any) -> Any:
            values[n.name] = out = super().run_node(n)
            return out

    with torch.no_grad():
        Recorder(gm).run(*inputs)
    nodes = list(gm.graph.nodes)
    placeholders = tuple(n.name for n in nodes if n.op == "placeholder")
    calls = [n for n in nodes if n.op == "call_module"]
    made: list[tuple[str, ...]] = []
    for call in calls:
        # A tuple's items by position ("" for one nothing reads), else the one output.
        items = {
            u.args[1]: u.name
            for u in call.users
            if u.op == "call_function" and u.target is operator.getitem
        }
        made.append(
            tuple(items.get(i, "") for i in range(max(items) + 1)) if items else (call.name,)
        )
    reads = [tuple(a.name for a in call.args) for call in calls]
    out = next(n for n in nodes if n.op == "output")
    final = [a.name for a in out.all_input_nodes]
    routes = []
    received = placeholders
    for k in range(len(calls)):
        later = {a for r in reads[k + 1 :] for a in r}
        have = [*received, *made[k]]
        carries = (
            tuple(dict.fromkeys(a for a in have if a in later))
            if k + 1 < len(calls)
            else tuple(final)
        )
        routes.append(Route(received, reads[k], made[k], carries))
        received = carries
    return tuple(routes), values


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


@dataclass(frozen=True)
class PipelineShape:
    """What every framework's pipeline export shares: where each stage's ranks are.

    Attributes:
        plan: the pipelined plan.
        stage_plans: each stage's own plan (:attr:`taps.Plan.stage_plans`).
    """

    plan: Plan

    @property
    def stage_plans(self) -> tuple[Plan, ...]:
        """Each stage's own plan (its sub-graph on a microbatch, on its sub-cluster)."""
        return self.plan.stage_plans

    @property
    def replicas(self) -> int:
        """Data-parallel copies of the whole pipeline."""
        assert self.plan.pipeline is not None and self.plan.pipeline.replicas is not None
        return self.plan.pipeline.replicas

    @property
    def microbatches(self) -> int:
        """Microbatches per step per copy."""
        assert self.plan.pipeline is not None and self.plan.pipeline.microbatches is not None
        return self.plan.pipeline.microbatches

    @property
    def schedule(self) -> str:
        """The taps schedule (``"gpipe"``, ``"1f1b"``, ``"interleaved-1f1b"``)."""
        assert self.plan.pipeline is not None and self.plan.pipeline.schedule is not None
        return self.plan.pipeline.schedule

    def ranks(self, stage: int, replica: int = 0) -> range:
        """The global ranks of ``stage`` in copy ``replica``, in the order of its plan's
        ranks."""
        if not 0 <= stage < len(self.plan.stages) or not 0 <= replica < self.replicas:
            raise ExportError(
                f"no stage {stage} of copy {replica}: the plan has {len(self.plan.stages)} "
                f"stages and {self.replicas} copies"
            )
        s = self.plan.stages[stage]
        shift = replica * self.plan.cluster.num_devices // self.replicas
        return range(s.first_device + shift, s.first_device + shift + s.devices)

    def place(self, rank: int) -> Place:
        """Where global ``rank`` works (:func:`taps.plan.stages.locate`)."""
        assert self.plan.pipeline is not None
        return locate(self.plan.stages, self.plan.pipeline, rank)

    def pipeline_groups(self) -> list[list[int]]:
        """The ranks that pass microbatches along (one per copy and place in a group), each
        in group order: ``torch.distributed.pipelining``'s process group of each rank."""
        assert self.plan.pipeline is not None and self.plan.pipeline.stages is not None
        groups = self.plan.pipeline.stages
        size = self.plan.stages[0].devices
        per = groups * size
        return [
            [r * per + g * size + i for g in range(groups)]
            for r in range(self.replicas)
            for i in range(size)
        ]

    def replica_groups(self) -> list[list[int]]:
        """The ranks that hold the same part of the model in every copy (their gradients are
        summed after the flush)."""
        per = self.plan.cluster.num_devices // self.replicas
        return [[r * per + i for r in range(self.replicas)] for i in range(per)]

    def header(self) -> dict[str, Any]:
        """The JSON fields every framework's document shares."""
        assert self.plan.pipeline is not None
        return {
            "pipeline": self.plan.pipeline.to_dict(),
            "stages": [
                {
                    "index": s.index,
                    "group": s.group,
                    "operators": [s.operators[0], s.operators[-1]],
                    "ranks": [list(self.ranks(s.index, r)) for r in range(self.replicas)],
                }
                for s in self.plan.stages
            ],
        }


# -- JAX ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JaxPipeline(PipelineShape):
    """A JAX mesh and shardings per stage: stage ``k``'s :class:`JaxShardings` is
    :func:`taps.export.to_jax` of its own plan, its mesh over its ranks' devices."""

    shardings: tuple[JaxShardings, ...] = ()

    def jax_mesh(self, stage: int, replica: int = 0, devices: Any = None) -> Any:
        """The ``jax.sharding.Mesh`` of ``stage`` in copy ``replica`` over its ranks of
        ``devices`` (default ``jax.devices()``)."""
        ranks = self.ranks(stage, replica)
        if devices is None:
            devices = require("jax", "jax", "a JAX mesh").devices()
        devices = list(devices)
        if len(devices) < self.plan.cluster.num_devices:
            raise ExportError(
                f"the plan needs {self.plan.cluster.num_devices} devices, JAX has {len(devices)}"
            )
        return jax_mesh(self.shardings[stage].mesh, [devices[r] for r in ranks])

    def sharding(self, stage: int, tensor: str, replica: int = 0, devices: Any = None) -> Any:
        """The ``NamedSharding`` of a tensor of ``stage`` on its mesh in copy ``replica``."""
        spec = self.shardings[stage].tensors.get(tensor)
        if spec is None:
            raise ExportError(f"stage {stage} has no tensor {tensor!r}")
        return named_sharding(self.jax_mesh(stage, replica, devices), spec)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (docs/export.md): the pipeline, and each stage's ranks and JAX
        document."""
        doc = {"format": FORMAT, "version": VERSION, "framework": "jax", **self.header()}
        for entry, s in zip(doc["stages"], self.shardings):
            entry["jax"] = s.to_dict()
        return doc

    def to_json(self) -> str:
        """The JSON document as text."""
        return to_text(self.to_dict())


def to_jax_pipeline(plan: Plan) -> JaxPipeline:
    """A mesh and ``PartitionSpec`` s per stage of a pipelined ``plan``."""
    _pipelined(plan)
    return JaxPipeline(
        plan, tuple(JaxShardings.from_layouts(layouts_of(p)) for p in plan.stage_plans)
    )


# -- torch.distributed.pipelining -----------------------------------------------------------


@dataclass(frozen=True)
class DTensorPipeline(PipelineShape):
    """Each stage's DTensor placements on its own sub-mesh (:func:`taps.export.to_dtensor` of
    its plan) and the ``torch.distributed.pipelining`` schedule: what a pipelined plan says
    without the module (:func:`to_pipeline` splits a module as it says)."""

    placements: tuple[DTensorPlacements, ...] = ()

    @property
    def schedule_class(self) -> str:
        """The name of the schedule class in ``torch.distributed.pipelining``."""
        return SCHEDULE_CLASSES[self.schedule]

    def stage_cuts(self) -> dict[int, Cut]:
        """The cut before each stage (none without a module)."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (docs/export.md): the pipeline, the schedule class, and each
        stage's cut, ranks and DTensor document."""
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "framework": "dtensor",
            "schedule_class": self.schedule_class,
            **self.header(),
        }
        cuts = self.stage_cuts()
        for entry, p in zip(doc["stages"], self.placements):
            c = cuts.get(entry["index"])
            entry["split"] = None if c is None else {"module": c.module, "point": c.point}
            entry["dtensor"] = p.to_dict()
        return doc

    def to_json(self) -> str:
        """The JSON document as text."""
        return to_text(self.to_dict())


def to_dtensor_pipeline(plan: Plan) -> DTensorPipeline:
    """Each stage's DTensor placements and the schedule of a pipelined ``plan``."""
    _pipelined(plan)
    return DTensorPipeline(plan, _stage_placements(plan))


def _stage_placements(plan: Plan) -> tuple[DTensorPlacements, ...]:
    return tuple(DTensorPlacements.from_layouts(layouts_of(p)) for p in plan.stage_plans)


@dataclass(frozen=True)
class TorchPipeline(DTensorPipeline):
    """A module split for ``torch.distributed.pipelining`` as a pipelined plan says.

    Attributes:
        placements: each stage's DTensor placements on its own sub-mesh.
        cuts: where the module is split before each stage but the first.
        pipe: the ``torch.distributed.pipelining.Pipe`` (``pipe.get_stage_module(k)``).
        stage_inputs: each stage module's example arguments on one microbatch (whole).
        routes: what each stage takes, runs and hands on (:class:`Route`).
        shapes: the whole shape of every tensor value of the split program on a microbatch.
        module_plans: each stage's plan on the graph of its stage module (its operators
            checked against the stage's, sizes included; its inputs named as the module names
            them).
    """

    cuts: tuple[Cut, ...] = ()
    pipe: Any = None
    stage_inputs: tuple[tuple[Any, ...], ...] = ()
    routes: tuple[Route, ...] = ()
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    module_plans: tuple[Plan, ...] = ()

    def stage_cuts(self) -> dict[int, Cut]:
        """The cut before each stage but the first."""
        return {c.stage: c for c in self.cuts}

    def stage_module(self, stage: int) -> Any:
        """The ``nn.Module`` of ``stage`` (its part of the module, its parameters' names
        kept)."""
        return self.pipe.get_stage_module(stage)

    def build(
        self,
        rank: int,
        loss_fn: Callable[..., Any] | None = None,
        device: Any = "cpu",
        scale_grads: bool = False,
    ) -> RankPipeline:
        """What global ``rank`` runs: its stages' modules distributed on their sub-meshes,
        their ``PipelineStage`` s and the schedule. Every rank of the default process group
        must call it, in step (it makes the process groups); the module must hold real
        values."""
        torch = require("torch", "torch", "a pipeline export")
        tdist = require("torch.distributed", "torch", "a pipeline export")
        pipelining = require("torch.distributed.pipelining", "torch", "a pipeline export")
        from torch.distributed.device_mesh import DeviceMesh

        from taps.export.distribute import distribute_module

        world = self.plan.cluster.num_devices
        if not tdist.is_initialized() or tdist.get_world_size() != world:
            have = tdist.get_world_size() if tdist.is_initialized() else 0
            raise ExportError(f"the plan runs on {world} ranks, the process group has {have}")
        place = self.place(rank)
        dev = torch.device(device)
        # Every rank makes every group and mesh, in one order (new_group is collective).
        pp = None
        for ranks in self.pipeline_groups():
            g = tdist.new_group(ranks)
            if rank in ranks:
                pp = g
        dp = None
        if self.replicas > 1:
            for ranks in self.replica_groups():
                g = tdist.new_group(ranks)
                if rank in ranks:
                    dp = g
        meshes: dict[int, Any] = {}
        for replica in range(self.replicas):
            for k, p in enumerate(self.placements):
                ids = torch.tensor(list(self.ranks(k, replica))).reshape(p.mesh.shape)
                mesh = DeviceMesh(dev.type, ids, mesh_dim_names=p.mesh.axis_names)
                if replica == place.replica and k in place.stages:
                    meshes[k] = mesh
        stages, modules = [], []
        n = len(self.plan.stages)
        for k in place.stages:
            module = self.stage_module(k).to(dev)
            dm = distribute_module(
                module, self.module_plans[k], *self.stage_inputs[k], mesh=meshes[k], mode="dtensor"
            )
            runner = _runner_class()(dm, self.routes[k], self.shapes, k == 0, k == n - 1)
            modules.append(dm)
            stages.append(pipelining.PipelineStage(runner, k, n, dev, group=pp))
        cls = getattr(pipelining, self.schedule_class)
        kw: dict[str, Any] = {"loss_fn": loss_fn, "scale_grads": scale_grads}
        schedule = cls(
            stages if self.schedule == "interleaved-1f1b" else stages[0], self.microbatches, **kw
        )
        return RankPipeline(place, tuple(stages), tuple(modules), schedule, pp, dp)


@dataclass
class RankPipeline:
    """What one rank runs of a :class:`TorchPipeline`.

    Attributes:
        place: where the rank works (copy, group, stages, rank in the group).
        stages: its ``PipelineStage`` s (one; the interleaved schedule's chunks).
        modules: each stage's module distributed on its sub-mesh
            (:class:`taps.export.DistributedModule`; ``grad(name)`` after a step).
        schedule: the ``torch.distributed.pipelining`` schedule object
            (``schedule.step(x, target=y)`` on the first and last stages, ``step()`` between).
        pipeline_group: the process group of the ranks that pass its microbatches along.
        replica_group: the ranks holding the same part in every copy (``None`` for one copy):
            all_reduce the gradients over it after the step.
    """

    place: Place
    stages: tuple[Any, ...]
    modules: tuple[Any, ...]
    schedule: Any
    pipeline_group: Any
    replica_group: Any = None


def _module_plan(module: Any, plan: Plan, inputs: Sequence[Any]) -> Plan:
    """``plan``'s strategies on the graph the front end makes of the stage's module (the same
    operators; its inputs named as the module names them)."""
    from taps.frontends.torch import from_torch

    graph = from_torch(module, *inputs, tie=False)
    unlike = unlike_operators(plan.graph, graph)
    if unlike:
        raise ExportError(f"the split module's stage is not the plan's stage: {unlike}")
    return Plan(graph, plan.cluster, dict(plan.strategies), plan.pricing)


def _send_placements(x: Any, mesh: Any) -> list[Any]:
    """A crossing tensor split evenly along its leading dim over the whole group (the same
    blocks on any mesh shape of the group's ranks), or whole where it does not split so."""
    dtensor = require("torch.distributed.tensor", "torch", "a pipeline export")
    size = math.prod(mesh.shape)
    if x.dim() and x.shape[0] % size == 0:
        return [dtensor.Shard(0)] * mesh.ndim
    return [dtensor.Replicate()] * mesh.ndim


@functools.cache
def _runner_class() -> Any:
    """The ``nn.Module`` class of a stage's runner (made on first use: torch is imported
    lazily)."""
    torch = require("torch", "torch", "a pipeline export")
    dtensor = require("torch.distributed.tensor", "torch", "a pipeline export")

    class _StageRunner(torch.nn.Module):  # type: ignore[name-defined]
        """A stage's distributed module between plain tensors (:class:`Route`): each value
        from another stage arrives and leaves as this rank's block of it
        (:func:`_send_placements`), one it only carries on leaves as it came; the first stage
        takes the microbatch whole, the last gives its outputs whole (for the loss)."""

        def __init__(
            self, dm: Any, route: Route, shapes: dict[str, Any], first: bool, last: bool
        ) -> None:
            super().__init__()
            self.dm, self.route, self.shapes = dm, route, shapes
            self.first, self.last = first, last
            #: Per value handed on in the last forward, whether it takes a gradient back.
            self.grads: list[bool] = []

        def arrive(self, name: str, x: Any) -> Any:
            if self.first or not isinstance(x, torch.Tensor):
                return x
            mesh, shape = self.dm.mesh, self.shapes[name]
            whole = torch.empty(shape, device="meta")
            return dtensor.DTensor.from_local(
                x,
                mesh,
                _send_placements(whole, mesh),
                run_check=False,
                shape=shape,
                stride=whole.stride(),
            )

        def forward(self, *xs: Any) -> Any:
            route, mesh = self.route, self.dm.mesh
            got = dict(zip(route.received, xs))
            out = self.dm(*(self.arrive(n, got[n]) for n in route.reads))
            outs = list(out) if isinstance(out, (list, tuple)) else [out]
            made = dict(zip(route.makes, outs))
            last = self.last
            done = []
            for n in route.carries:
                y = made.get(n)
                if y is None:  # carried on as it came (the first stage's inputs: its block)
                    x = got[n]
                    if self.first and isinstance(x, torch.Tensor):
                        x = dtensor.distribute_tensor(
                            x, mesh, _send_placements(x, mesh), src_data_rank=None
                        ).to_local()
                    done.append(x.view_as(x) if isinstance(x, torch.Tensor) else x)
                elif not isinstance(y, dtensor.DTensor):
                    done.append(y)
                elif last:
                    done.append(y.full_tensor())
                else:
                    done.append(y.redistribute(mesh, _send_placements(y, mesh)).to_local())
            self.grads = [bool(getattr(y, "requires_grad", False)) for y in done]
            return done[0] if len(done) == 1 else tuple(done)

    return _StageRunner


def to_pipeline(module: Any, plan: Plan, *example_inputs: Any) -> TorchPipeline:
    """The split of ``module`` (called on ``example_inputs``, the whole batch, as
    :func:`taps.from_torch` converted it for ``plan``) for ``torch.distributed.pipelining``: one
    stage module per stage of the pipelined ``plan``, cut at the module boundaries its cuts fall
    on (:func:`split_points`), each stage's DTensor placements, and the schedule; call
    :meth:`TorchPipeline.build` on every rank to run it. ``module`` is left as it was (the stage
    modules hold a copy of its parameters)."""
    torch = require("torch", "torch", "a pipeline export")
    pipelining = require("torch.distributed.pipelining", "torch", "a pipeline export")
    _pipelined(plan)
    if not isinstance(module, torch.nn.Module):
        raise ExportError(f"to_pipeline needs a torch.nn.Module, got {type(module).__name__}")
    cuts = split_points(plan, _callable_modules(module))
    shape = PipelineShape(plan)
    parts = shape.replicas * shape.microbatches
    mb = microbatch(example_inputs, parts)
    spec = {
        c.module: (
            pipelining.SplitPoint.BEGINNING if c.point == "beginning" else pipelining.SplitPoint.END
        )
        for c in cuts
    }
    try:
        # On a copy: the split changes the module it traces (it cannot split it twice).
        pipe = pipelining.pipeline(copy.deepcopy(module), mb_args=mb, split_spec=spec)
    except Exception as e:  # torch raises many kinds; the user needs the message, once
        raise ExportError(
            f"torch.distributed.pipelining could not split the module: {_first_line(e)}"
        ) from None
    if pipe.num_stages != len(plan.stages):
        raise ExportError(
            f"the module split into {pipe.num_stages} stages, the plan has {len(plan.stages)}"
        )
    routes, values = _routes(pipe, mb)

    def example(name: str) -> Any:
        x = values[name]
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.detach().requires_grad_(True)  # another stage's output
        return x

    inputs = tuple(
        mb if k == 0 else tuple(example(n) for n in r.reads) for k, r in enumerate(routes)
    )
    shapes = {n: tuple(v.shape) for n, v in values.items() if isinstance(v, torch.Tensor)}
    # Each stage module against its stage's plan now, not on the ranks: a module called on
    # another batch splits the same way, with the same operator names.
    module_plans = tuple(
        _module_plan(pipe.get_stage_module(k), p, inputs[k]) for k, p in enumerate(plan.stage_plans)
    )
    return TorchPipeline(
        plan, _stage_placements(plan), cuts, pipe, inputs, routes, shapes, module_plans
    )
