"""A taps plan applied to a PyTorch module: every parameter a DTensor in taps' placements, and the
module run so that every operator reads its inputs, and makes its output, in the placements taps
chose (docs/export.md).

The module is run as the very program the torch front end converted: ``torch.export`` of the
module, interpreted node by node (:class:`torch.fx.Interpreter`) on DTensors. A node that made
taps operators (:attr:`taps.frontends.torch.Conversion.links`) has each linked argument
redistributed to the placements of the operator's input slot before it runs, and its output
redistributed to the operator's output placements after; DTensor computes each node on the local
blocks (its own sharding propagation picks the local kernel, and may add collectives of its own
where its rules want other placements). Nodes that made no operator (views, transposes) run as
DTensor propagates them.

A placement list of the plan is per mesh dim over the dims of the operator's operand in the
graph; the node's argument views that graph tensor through a row-major reshape (rows: batch and
sequence seen as one dim) and a permutation. :func:`framework_placements` maps one onto the
other: a mesh dim that splits the top factor of a graph dim splits the top factor of the framework
dim that holds the same part of the flattened index.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from taps._core import Layout, Redistribution
from taps._support.extras import require
from taps.errors import ExportError
from taps.export.dtensor import (
    PARTIAL,
    REPLICATE,
    DTensorPlacements,
    layout_placements,
    placement_objects,
)
from taps.graph import Graph
from taps.plan.layouts import PlanLayouts, layouts_of
from taps.plan.plan import Plan
from taps.search.evaluate import StepLayouts, step_layouts
from taps.search.prices import Collective
from taps.steps.torch import Steps

#: How a module runs (see :func:`distribute_module`).
MODES = ("dtensor", "taps")


@dataclass(frozen=True)
class Replay:
    """What running taps' plan exactly needs beyond the placements: the plan as its pricing's
    step runs it (:func:`taps.search.evaluate.step_layouts`).

    Attributes:
        layouts: the step's layouts (in the training step, forward plans from flowing partial
            sums, on a mesh fitting the backward plans too).
        redistributions: taps' redistribution of each operator input slot ``(operator, slot)``.
        backward: in the training step, the backward plan of each input slot's gradient (``None``
            for no gradient); empty in the paper's model, where autograd takes the gradient back
            through the forward steps.
        partial: per operator, the mesh axes its forward partial sum runs over (its local
            result is partial along them before the all_reduce).
        flowing: per operator whose partial sums flow to its consumer (training step), the mesh
            axes of its partial output (a bias is added on the first rank along them).
        gradients: in the training step, taps' gradient collective of each input slot that reads
            a parameter or an input (``(operator, slot)``).
        used: per operator, the mesh axes its strategy splits anything along: an input
            replicated along one of them gets a partial gradient there (the paper's model).
    """

    layouts: PlanLayouts
    redistributions: dict[tuple[str, int], Redistribution]
    backward: dict[tuple[str, int], Redistribution | None]
    partial: dict[str, tuple[str, ...]]
    flowing: dict[str, tuple[str, ...]]
    gradients: dict[tuple[str, int], Collective]
    used: dict[str, set[str]]
    steps: Steps

    @property
    def training(self) -> bool:
        """Whether this replays the training step (taps' own backward plans)."""
        return self.layouts.plan.pricing.step == "training"

    @classmethod
    def of(cls, step: StepLayouts, device_mesh: Any) -> Replay:
        layouts = step.layouts
        mesh, graph = layouts.mesh, layouts.plan.graph
        chosen = layouts.plan.candidates
        partial: dict[str, tuple[str, ...]] = {}
        flowing: dict[str, tuple[str, ...]] = {}
        gradients: dict[tuple[str, int], Collective] = {}
        used: dict[str, set[str]] = {}
        for op in graph.ops:
            partial[op.name] = next(
                (
                    mesh.unused_axes(c.layout)
                    for c in step.intra[op.name]
                    if c.reason == "forward partial sum"
                ),
                (),
            )
            if op.name in step.flows:
                out = chosen[op.name].partial_output
                flowing[op.name] = mesh.group_axes(out, out.partial) if out.partial else ()
            grads = [c for c in step.intra[op.name] if c.reason == "gradient"]
            for slot, o in enumerate(op.inputs):
                c = next((c for c in grads if c.tensor == o.tensor), None)
                if c is not None:
                    grads.remove(c)
                    gradients[(op.name, slot)] = c
            every = [*layouts.inputs[op.name], layouts.outputs[op.name]]
            used[op.name] = set().union(*(mesh.used_axes(lay) for lay in every))
            used[op.name].update(partial[op.name])
        plans = {(e.consumer, e.slot): r for e, r in layouts.redistributions}
        backward = {
            (e.consumer, e.slot): b for (e, _), b in zip(layouts.redistributions, step.backward)
        }
        if layouts.plan.pricing.step != "training":
            backward, gradients = {}, {}
        return cls(
            layouts,
            plans,
            backward,
            partial,
            flowing,
            gradients,
            used,
            Steps(mesh, device_mesh),
        )


if TYPE_CHECKING:
    from taps.frontends.torch import Conversion, Link


def _torch() -> Any:
    return require("torch", "torch", "taps.export.distribute_module")


def framework_placements(
    texts: Sequence[str],
    mesh_shape: Sequence[int],
    operand_shape: Sequence[int],
    graph_shape: Sequence[int],
    perm: Sequence[int],
) -> tuple[str, ...]:
    """The placements (per mesh dim) of a framework tensor that views a graph tensor of shape
    ``graph_shape`` through ``perm`` (framework dim ``i`` is graph dim ``perm[i]``), given the
    placements ``texts`` of the same data seen as ``operand_shape`` (a row-major reshape of
    ``graph_shape``). An :class:`ExportError` when a split has no DTensor form on the framework
    dims (it would need a block that is not a top factor of one dim)."""
    if math.prod(operand_shape) != math.prod(graph_shape):
        raise ExportError(f"{list(operand_shape)} is no reshape of {list(graph_shape)}")

    def spans(shape: Sequence[int]) -> list[tuple[int, int]]:
        """Per dim, ``(stride, stride * size)``: the part of the flattened index it holds."""
        out = []
        for i, size in enumerate(shape):
            stride = math.prod(shape[i + 1 :])
            out.append((stride, stride * size))
        return out

    # Each split mesh dim as the range of the flattened index it splits: the top factor of a
    # graph dim, below the factors of the mesh dims before it on that dim.
    ranges: list[tuple[int, int, int]] = []  # (mesh dim, lo, hi) of the flattened index
    span_b = spans(operand_shape)
    top: dict[int, int] = {}
    for m, p in enumerate(texts):
        if not p.startswith("Shard(") or mesh_shape[m] == 1:  # a split in one piece is none
            continue
        dim = int(p[6:-1])
        hi = top.get(dim, span_b[dim][1])
        lo, rem = divmod(hi, mesh_shape[m])
        if rem or lo < span_b[dim][0]:
            raise ExportError(f"mesh dim {m} does not divide dim {dim} of {list(operand_shape)}")
        top[dim] = lo
        ranges.append((m, lo, hi))
    span_a = spans(graph_shape)
    owner: dict[int, int] = {}
    for m, lo, hi in ranges:
        found = next(
            (i for i, (s, e) in enumerate(span_a) if s < e and s <= lo and hi <= e),
            None,
        )
        if found is None:
            raise ExportError(
                f"the split of {list(operand_shape)} by {list(texts)} has no DTensor form on "
                f"{list(graph_shape)}"
            )
        owner[m] = found
    # On each dim, the mesh dims must split from the top down, in mesh order (DTensor's order).
    for dim in set(owner.values()):
        ms = sorted(m for m in owner if owner[m] == dim)
        hi = span_a[dim][1]
        for m in ms:
            (_, lo, h) = next(r for r in ranges if r[0] == m)
            if h != hi:
                raise ExportError(
                    f"the split of {list(operand_shape)} by {list(texts)} has no DTensor form "
                    f"on {list(graph_shape)}"
                )
            hi = lo
    inverse = {g: i for i, g in enumerate(perm)}
    out = []
    for m, p in enumerate(texts):
        if m in owner:
            out.append(f"Shard({inverse[owner[m]]})")
        else:
            out.append(PARTIAL if p == PARTIAL else REPLICATE)
    return tuple(out)


def _contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


def _shard_shape(
    texts: Sequence[str], mesh_shape: Sequence[int], shape: Sequence[int]
) -> list[int]:
    """The local block's shape of a tensor of ``shape`` under placements ``texts``."""
    out = list(shape)
    for m, p in enumerate(texts):
        if p.startswith("Shard("):
            out[int(p[6:-1])] //= mesh_shape[m]
    return out


def _leaves(tree: Any) -> list[Any]:
    """The leaves of nested lists and tuples, in order (the front end's flattening)."""
    if isinstance(tree, (list, tuple)):
        return [x for t in tree for x in _leaves(t)]
    return [tree]


def _replace_leaves(tree: Any, leaves: list[Any]) -> Any:
    """``tree`` with its leaves taken in order from ``leaves`` (consumed)."""
    if isinstance(tree, (list, tuple)):
        return type(tree)(_replace_leaves(t, leaves) for t in tree)
    return leaves.pop(0)


class Tracer:
    """What a verifier hears of a run: :meth:`scope` is entered around every redistribution of
    an operator's input (``("edge", op, slot)``; ``("leaf", op, slot)`` for a parameter or input
    read in another layout than at its first reader), around every operator's node and output
    redistribution (``("op", op, None)``) and around a node that made no operator (``("node",
    name, None)``); :meth:`mark` wraps each operator's output so that the backward pass can say
    which operator it is in. The default does nothing."""

    def scope(self, kind: str, op: str, slot: int | None) -> AbstractContextManager[Any]:
        return nullcontext()

    def mark(self, x: Any, op: str) -> Any:
        return x


class DistributedModule:
    """A module run on DTensors in taps' placements (see :func:`distribute_module`).

    Attributes:
        chosen: the DTensor placements taps chose for every tensor and operator.
        conversion: the front end's conversion of the module (the graph and the links of each fx
            node to its operators).
        mesh: the torch ``DeviceMesh``.
        parameters: every parameter as a DTensor (``requires_grad`` as the module's), by
            ``state_dict`` key (the module itself is left as it was): a leaf, except with a
            replay (:meth:`leaf`); :meth:`grad` gives the gradient either way.
        buffers: buffers and constants, replicated.
        replay: what ``mode="taps"`` runs (``None`` in DTensor's mode).
        tracer: told of every redistribution and operator (a verifier's recorder).
    """

    def __init__(
        self,
        program: Any,
        conversion: Conversion,
        chosen: DTensorPlacements,
        mesh: Any,
        parameters: dict[str, Any],
        buffers: dict[str, Any],
        replay: Replay | None = None,
    ) -> None:
        self.program, self.conversion, self.chosen, self.mesh = program, conversion, chosen, mesh
        self.buffers = buffers
        self.replay = replay
        self.tracer = Tracer()
        self.leaves: dict[str, tuple[Any, Any]] = {}
        unplaced = sorted(set(parameters) - set(chosen.tensors))
        if unplaced:
            raise ExportError(f"the plan places no parameter {unplaced[:5]} of the module")
        #: Training-step replay: per parameter or input, each reader's block (a leaf of its own),
        #: its placements and the reader's view of the whole (see :meth:`reader_block`).
        self.readers: dict[str, list[tuple[Any, list[Any], tuple[int, ...]]]] = {}
        self.parameters = {
            name: self.leaf(name, p, chosen.tensors[name]) for name, p in parameters.items()
        }

    @property
    def graph(self) -> Graph:
        """The graph the front end made of the module."""
        return self.conversion.graph

    def placements(
        self, texts: Sequence[str], link: Link, shape: Sequence[int] | None = None
    ) -> list[Any]:
        """The placement objects of the node's tensor a link names, for placements ``texts``
        of the linked operand (or of the same data seen as ``shape``)."""
        operand = link.operand_shape if shape is None else shape
        shape_of_mesh = self.chosen.mesh.shape
        return placement_objects(
            framework_placements(texts, shape_of_mesh, operand, link.graph_shape, link.perm)
        )

    def layout_placements(self, layout: Layout, link: Link) -> list[Any]:
        """The placement objects of the node's tensor a link names, in ``layout`` (of the
        linked operand, in any shape it can be reshaped to)."""
        return self.placements(layout_placements(self.chosen.mesh, layout), link, layout.shape)

    def distribute_input(self, name: str, value: Any) -> Any:
        """An input of the program as a DTensor in the plan's placements (each rank takes its
        block of the same whole tensor: no communication)."""
        texts = self.chosen.tensors.get(name, (REPLICATE,) * len(self.chosen.mesh.shape))
        return self.leaf(name, value, texts)

    def leaf(self, name: str, value: Any, texts: Sequence[str]) -> Any:
        """``value`` distributed in placements ``texts``. With a replay, a gradient-taking leaf
        is the rank's local block (kept in :attr:`leaves`) seen as a DTensor: the autograd
        engine then accumulates its gradient on the block, not on a DTensor (DTensor's
        propagation of that ``detach`` searches a space exponential in the mesh dims)."""
        dtensor = require("torch.distributed.tensor", "torch", "distribute_module")
        if self.replay is not None and self.replay.training:
            # Whole on every rank: each reader takes its block of it (reader_block).
            texts = (REPLICATE,) * len(self.chosen.mesh.shape)
            self.readers[name] = []
        made = dtensor.distribute_tensor(
            value.detach(), self.mesh, placement_objects(texts), src_data_rank=None
        )
        if self.replay is not None and self.replay.training:
            return made
        if self.replay is None or not value.requires_grad:
            return made.requires_grad_(value.requires_grad)
        local = made.to_local().requires_grad_(True)
        self.leaves[name] = (local, made)
        return dtensor.DTensor.from_local(
            local,
            self.mesh,
            made.placements,
            run_check=False,
            shape=made.shape,
            stride=made.stride(),
        )

    def reader_block(self, x: Any, name: str, placements: list[Any], grad: bool) -> Any:
        """The block in ``placements`` of ``x``, a view of the parameter or input ``name``, which
        the training-step replay holds whole on every rank: taken locally (no communication), a
        leaf of its own when ``grad``, its gradient summed into ``name``'s by :meth:`grad`."""
        dtensor = require("torch.distributed.tensor", "torch", "distribute_module")
        whole = x.to_local() if isinstance(x, dtensor.DTensor) else x
        block = dtensor.distribute_tensor(
            whole.detach(), self.mesh, placements, src_data_rank=None
        ).to_local()
        if grad:
            block = block.detach().requires_grad_(True)
            self.readers.setdefault(name, []).append((block, placements, tuple(whole.shape)))
        return block

    def grad(self, name: str) -> Any:
        """The gradient of a parameter or input (by name) as a DTensor in its placements, or
        ``None`` (in the training-step replay, replicated: its readers' gradients summed)."""
        if self.readers.get(name):
            DTensor = require("torch.distributed.tensor", "torch", "grad").DTensor
            total = None
            for block, placements, shape in self.readers[name]:
                if block.grad is None:
                    continue
                whole = DTensor.from_local(
                    block.grad,
                    self.mesh,
                    placements,
                    run_check=False,
                    shape=shape,
                    stride=_contiguous(shape),
                ).full_tensor()
                whole = whole.reshape(
                    self.parameters[name].shape if name in self.parameters else whole.shape
                )
                total = whole if total is None else total + whole
            if total is None:
                return None
            replicate = placement_objects((REPLICATE,) * len(self.chosen.mesh.shape))
            return DTensor.from_local(total, self.mesh, replicate, run_check=False)
        if name in self.leaves:
            local, made = self.leaves[name]
            if local.grad is None:
                return None
            return require("torch.distributed.tensor", "torch", "grad").DTensor.from_local(
                local.grad,
                self.mesh,
                made.placements,
                run_check=False,
                shape=made.shape,
                stride=made.stride(),
            )
        return self.parameters[name].grad if name in self.parameters else None

    def __call__(self, *inputs: Any) -> Any:
        """Run the module on ``inputs`` (whole tensors, or DTensors already placed); the
        outputs are DTensors in the placements of the operators that make them."""
        torch = _torch()
        dtensor = require("torch.distributed.tensor", "torch", "distribute_module")
        sig = self.program.graph_signature
        users = iter(inputs)
        args = []
        for spec in sig.input_specs:
            kind, target = spec.kind.name, spec.target
            if kind == "PARAMETER":  # a tied weight's other keys read the one parameter
                args.append(self.parameters[self.conversion.aliases.get(target, target)])
            elif kind == "USER_INPUT":
                x = next(users)
                if isinstance(x, torch.Tensor) and not isinstance(x, dtensor.DTensor):
                    x = self.distribute_input(spec.arg.name, x)
                args.append(x)
            else:
                args.append(self.buffers[target])
        out = _Interpreter(self).run(*args)
        out = [o.whole() if isinstance(o, _Pending) else o for o in out]
        return out[0] if len(out) == 1 else out


@dataclass(frozen=True)
class _Pending:
    """A reshape the replay cannot place as a DTensor (its split is an inner factor of the new
    shape), kept as its input until the operator that reads it takes the input's local block
    through taps' steps (taps' reshapes move nothing; DTensor's would, and slowly)."""

    x: Any
    shape: tuple[int, ...]

    def whole(self) -> Any:
        """The reshape done by DTensor, for a reader that is no operator of the plan."""
        return self.x.reshape(self.shape)


class _Interpreter:
    """The exported program run node by node, with taps' redistributions at linked nodes."""

    def __init__(self, dist: DistributedModule) -> None:
        torch = _torch()
        self.dist = dist
        self.dtensor = require("torch.distributed.tensor", "torch", "distribute_module")
        outer = self

        class Run(torch.fx.Interpreter):  # type: ignore[misc,name-defined]
            def run_node(self, n: Any) -> Any:
                self.node = n
                return super().run_node(n)

            def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
                return outer.call(self.node, target, args, kwargs)

        self.interpreter = Run(dist.program.graph_module)
        aten = torch.ops.aten
        self.views = {aten.view, aten.reshape, aten._unsafe_view}
        self.permutes = {aten.transpose, aten.permute, aten.t}
        self.locals: dict[int, tuple[Any, Any]] = {}  # the DTensor kept: its id stays its own

    def run(self, *args: Any) -> Any:
        return self.interpreter.run(*args, enable_io_processing=False)

    def local_of(self, x: Any) -> Any:
        """``x.to_local()``, once per DTensor: the gradients of its readers then add up on the
        local blocks (adding DTensor gradients runs DTensor's propagation, whose search grows
        exponentially with the mesh dims)."""
        key = id(x)
        if key not in self.locals:
            self.locals[key] = (x, x.to_local())
        return self.locals[key][1]

    def _as_dtensors(self, leaves: list[Any]) -> list[Any]:
        """Plain tensors beside DTensors (constants made in the program) as replicated
        DTensors: DTensor refuses to mix them."""
        torch, DTensor = _torch(), self.dtensor.DTensor
        if not any(isinstance(x, DTensor) for x in leaves):
            return leaves
        mesh = self.dist.mesh
        replicate = [self.dtensor.Replicate()] * mesh.ndim
        return [
            DTensor.from_local(x, mesh, replicate, run_check=False)
            if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) and x.dim() > 0
            else x
            for x in leaves
        ]

    def _to(self, x: Any, placements: list[Any]) -> Any:
        if not isinstance(x, self.dtensor.DTensor) or list(x.placements) == placements:
            return x
        if self.dist.replay is not None:
            # From the rank's block (see local_of), so that gradients add up on blocks.
            x = self.dtensor.DTensor.from_local(
                self.local_of(x),
                self.dist.mesh,
                x.placements,
                run_check=False,
                shape=x.shape,
                stride=x.stride(),
            )
        return x.redistribute(self.dist.mesh, placements)

    def view(self, x: Any, shape: Sequence[int]) -> Any:
        """``x.view(shape)`` on the local block, when ``x``'s split dims stay top factors of the
        dims of ``shape`` (a view moves nothing in taps); ``None`` when not (DTensor decides)."""
        shape = [int(s) for s in shape]
        if -1 in shape:
            shape[shape.index(-1)] = x.numel() // -math.prod(shape)
        texts = [
            f"Shard({p.dim})" if p.is_shard() else PARTIAL if p.is_partial() else REPLICATE
            for p in x.placements
        ]
        mesh_shape = tuple(self.dist.mesh.shape)
        try:
            out = framework_placements(
                texts, mesh_shape, tuple(x.shape), shape, tuple(range(len(shape)))
            )
        except ExportError:
            return None
        local = self.local_of(x).reshape(_shard_shape(out, mesh_shape, shape))
        return self.dtensor.DTensor.from_local(
            local,
            self.dist.mesh,
            placement_objects(out),
            run_check=False,
            shape=tuple(shape),
            stride=_contiguous(shape),
        )

    def permute(self, node: Any, target: Any, args: Any) -> Any:
        """A transpose or permute on the local block, its placements permuted alike (DTensor's
        own propagation searches a space exponential in the mesh dims)."""
        x, rank = args[0], args[0].dim()
        if packet_name(target) == "permute":
            order = [d % rank for d in args[1]]
        elif packet_name(target) == "t" or rank < 2:
            order = list(range(rank))[::-1]
        else:
            order = list(range(rank))
            a, b = args[1] % rank, args[2] % rank
            order[a], order[b] = order[b], order[a]
        placements = [
            self.dtensor.Shard(order.index(p.dim)) if p.is_shard() else p for p in x.placements
        ]
        val = node.meta["val"]
        return self.dtensor.DTensor.from_local(
            target(self.local_of(x), *args[1:]),
            self.dist.mesh,
            placements,
            run_check=False,
            shape=tuple(val.shape),
            stride=tuple(val.stride()),
        )

    def call(self, node: Any, target: Any, args: Any, kwargs: Any) -> Any:
        dist, tracer = self.dist, self.dist.tracer
        packet = getattr(target, "_overloadpacket", None)
        if packet_name(target).startswith("_assert"):
            return None  # export's checks of shapes, dtypes and devices: nothing to compute
        if packet in self.views and isinstance(args[0], self.dtensor.DTensor):
            out = self.view(args[0], args[1])
            if out is not None:
                return out
            if dist.replay is not None:
                return _Pending(args[0], tuple(int(d) for d in node.meta["val"].shape))
        if packet in self.permutes and isinstance(args[0], self.dtensor.DTensor):
            return self.permute(node, target, args)
        links = dist.conversion.links.get(node.name, [])
        outputs = [link for link in links if link.slot is None]
        leaves = _leaves([*args, *kwargs.values()])
        if dist.replay is not None and outputs:
            return self.local(node, target, self._as_dtensors(leaves), links, outputs[0])
        with tracer.scope("node", node.name, None):
            leaves = [x.whole() if isinstance(x, _Pending) else x for x in leaves]
        leaves = self._as_dtensors(leaves)
        ops = dist.chosen.operators
        for link in links:
            if link.slot is not None:
                with tracer.scope("edge", link.op, link.slot):
                    want = dist.placements(ops[link.op]["inputs"][link.slot], link)
                    leaves[link.arg] = self._to(leaves[link.arg], want)
        tree = _replace_leaves([*args, *kwargs.values()], leaves)
        with (
            tracer.scope("op", links[0].op, None)
            if links
            else tracer.scope("node", node.name, None)
        ):
            out = target(*tree[: len(args)], **dict(zip(kwargs, tree[len(args) :])))
            for link in outputs:
                out = self._to(out, dist.placements(ops[link.op]["output"], link))
                out = tracer.mark(out, link.op)
        return out

    def holds(self, x: Any, layout: Layout) -> bool:
        """Whether DTensor ``x``'s local block, reshaped, is ``layout``'s (its placements are
        the layout's, carried onto its shape in its own dim order)."""
        mesh = self.dist.chosen.mesh
        try:
            texts = framework_placements(
                layout_placements(mesh, layout),
                mesh.shape,
                layout.shape,
                tuple(x.shape),
                tuple(range(x.dim())),
            )
        except ExportError:
            return False
        return list(x.placements) == placement_objects(texts)

    def local_input(self, x: Any, link: Link) -> Any:
        """The local block of argument ``x`` in the layout of the operator's input slot: taken
        there by taps' steps (in the edge's scope), its gradient summed over the mesh dims the
        operator splits and it does not (in the operator's scope)."""
        dist = self.dist
        replay, mesh = dist.replay, dist.chosen.mesh
        assert replay is not None and link.slot is not None
        plan = replay.redistributions.get((link.op, link.slot))
        ours = replay.layouts.inputs[link.op][link.slot]
        with dist.tracer.scope("edge", link.op, link.slot):
            first = (
                None if plan is None else plan.all_ops[0].layout if plan.all_ops else plan.target
            )
            if isinstance(x, _Pending) and not (first and self.holds(x.x, first)):
                x = x.whole()
            if plan is not None and first is not None:
                rank = len(link.perm)
                if isinstance(x, _Pending):
                    local = self.local_of(x.x)  # the block of the plan's source, in its own order
                else:
                    x = self._to(x, dist.layout_placements(first, link))
                    local = self.local_of(x).permute([link.perm.index(g) for g in range(rank)])
                if replay.training:
                    local = replay.steps.edge(
                        local,
                        plan,
                        replay.backward.get((link.op, link.slot)),
                        lambda: dist.tracer.scope("edge", link.op, link.slot),
                    )
                else:
                    local = replay.steps.walk(local, plan)
                shape = _shard_shape(
                    framework_placements(
                        layout_placements(mesh, ours),
                        mesh.shape,
                        ours.shape,
                        link.graph_shape,
                        tuple(range(rank)),
                    ),
                    mesh.shape,
                    link.graph_shape,
                )
                local = local.reshape(shape).permute(list(link.perm))
            elif replay.training:
                # A parameter or input: each reader takes its block of the whole (no edge).
                graph = dist.graph
                root = graph.root(graph.op(link.op).inputs[link.slot].tensor)
                local = dist.reader_block(
                    x.whole() if isinstance(x, _Pending) else x,
                    root.name,
                    dist.layout_placements(ours, link),
                    root.name in dist.readers and root.requires_grad,
                )
            else:
                # A parameter or input read here in another layout than at its first reader:
                # taps places it for each reader (no edge); the move has a scope of its own.
                with dist.tracer.scope("leaf", link.op, link.slot):
                    local = self.local_of(self._to(x, dist.layout_placements(ours, link)))
        if replay.training:
            c = replay.gradients.get((link.op, link.slot))
            if c is None:
                return local
            return replay.steps.gradient_sync(
                local,
                mesh.unused_axes(c.layout),
                c.zero,
                lambda: dist.tracer.scope("op", link.op, None),
            )
        with dist.tracer.scope("op", link.op, None):
            lacks = replay.used[link.op] - mesh.used_axes(ours)
            return replay.steps.sum_grad(local, _ordered(mesh.axis_names, lacks))

    def _aligned(
        self,
        x: Any,
        linked: dict[int, tuple[tuple[int, ...], list[Any]]],
        shape: tuple[int, ...],
        placements: list[Any],
    ) -> Any:
        """A whole tensor the operator reads beside its graph operands (a buffer, a constant
        table) as the rank's block of it: in the placements of a linked input of its shape
        (BatchNorm's running statistics, shaped as its weight), else cut where it broadcasts
        against a split dim of the output (rotary tables, masks)."""
        dtensor, mesh = self.dtensor, self.dist.mesh
        same = next((p for s, p in linked.values() if s == tuple(x.shape)), None)
        if same is not None:
            return dtensor.distribute_tensor(x.detach(), mesh, same, src_data_rank=None).to_local()
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        sizes, offsets = compute_local_shape_and_global_offset(shape, mesh, placements)
        lead = len(shape) - x.dim()
        for d in range(max(0, -lead), x.dim()):
            o = d + lead
            if x.shape[d] == shape[o] and sizes[o] != shape[o]:
                x = x.narrow(d, offsets[o], sizes[o])
        return x

    def local(self, node: Any, target: Any, leaves: list[Any], links: list[Link], out: Link) -> Any:
        """The node run on each rank's blocks, as taps' plan runs it (:class:`Replay`): every
        input in the operator's layout, the result summed over the operator's forward partial
        sum (a linear layer's bias added after it) and made a DTensor in the output's
        placements."""
        DTensor, dist, torch = self.dtensor.DTensor, self.dist, _torch()
        replay, mesh = dist.replay, dist.chosen.mesh
        assert replay is not None
        partial = replay.partial[out.op]
        flowing = replay.flowing.get(out.op)
        bias = None
        split = partial or flowing
        if split and _has_bias(target) and len(leaves) >= 3 and leaves[2] is not None:
            bias, leaves = leaves[2], [*leaves[:2], None, *leaves[3:]]
        val = node.meta["val"]
        placements = (
            dist.layout_placements(replay.layouts.plan.candidates[out.op].partial_output, out)
            if flowing is not None
            else dist.placements(dist.chosen.operators[out.op]["output"], out)
        )
        local: list[Any] = []
        linked: dict[int, Any] = {}  # the global shapes and placements of the linked inputs
        for k, x in enumerate(leaves):
            link = next((li for li in links if li.slot is not None and li.arg == k), None)
            if link is not None and isinstance(x, (torch.Tensor, _Pending)):
                local.append(self.local_input(x, link))
                assert link.slot is not None
                ours = replay.layouts.inputs[link.op][link.slot]
                linked[k] = (tuple(x.shape), dist.layout_placements(ours, link))
            else:
                x = x.whole() if isinstance(x, _Pending) else x
                local.append(self.local_of(x) if isinstance(x, DTensor) else x)
        packet = packet_name(target)
        for k, x in enumerate(local):
            if k not in linked and isinstance(x, torch.Tensor) and x.dim() > 0:
                local[k] = self._aligned(x, linked, tuple(val.shape), placements)
            elif k == 0 and packet.endswith("_") and isinstance(x, torch.Tensor):
                local[k] = x.clone()  # an in-place operator (relu_) writes a copy of its input
        if packet == "expand":  # its sizes (flattened after the input) are the output's
            shape = _local_shape(tuple(val.shape), dist.mesh, placements)
            for i, size in enumerate(shape):
                local[1 + i] = -1 if local[1 + i] == -1 else size
        share = _mean_share(node, leaves[0], local[0]) if packet == "mean" else 1.0
        tree = _replace_leaves(list(node.args) + list(node.kwargs.values()), local)
        n = len(node.args)
        with dist.tracer.scope("op", out.op, None):
            result = target(*tree[:n], **dict(zip(node.kwargs, tree[n:])))
            if packet == "mean":
                result = result * share
            result = replay.steps.sum(result, partial)
            if bias is not None and replay.training:
                link = next(li for li in links if li.slot is not None and li.arg == 2)
                b = self.local_input(bias, link)
                if packet == "convolution":  # a bias per channel
                    b = b.reshape(-1, *([1] * (result.dim() - 2)))
                result = replay.steps.add_once(result, b, flowing or ())
            elif bias is not None:
                link = next(li for li in links if li.slot is not None and li.arg == 2)
                layout = replay.layouts.outputs[out.op]
                used = {a for axes in mesh.dim_axes(layout) for a in axes}
                assert link.slot is not None
                ours = replay.layouts.inputs[link.op][link.slot]
                b = self.local_of(self._to(bias, dist.layout_placements(ours, link)))
                have = {a for axes in mesh.dim_axes(ours) for a in axes}
                result = result + replay.steps.sum_grad(b, _ordered(mesh.axis_names, used - have))
            made = DTensor.from_local(
                result,
                dist.mesh,
                placements,
                run_check=False,
                shape=tuple(val.shape),
                stride=tuple(val.stride()),
            )
            return dist.tracer.mark(made, out.op)


def _mean_share(node: Any, whole: Any, block: Any) -> float:
    """The share of a mean's elements a rank's block holds: the local mean over a split dim,
    scaled by it, sums over the ranks to the mean (torch divides by the local count)."""
    rank = len(whole.shape)
    dims = node.args[1] if len(node.args) > 1 and node.args[1] is not None else range(rank)
    dims = [int(d) % rank for d in dims]
    return math.prod(block.shape[d] for d in dims) / math.prod(whole.shape[d] for d in dims)


def _local_shape(shape: tuple[int, ...], mesh: Any, placements: list[Any]) -> list[int]:
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    return list(compute_local_shape_and_global_offset(shape, mesh, placements)[0])


def _ordered(names: Sequence[str], chosen: set[str]) -> tuple[str, ...]:
    return tuple(a for a in names if a in chosen)


def packet_name(target: Any) -> str:
    """The name of an aten operator's overload packet (``"transpose"``)."""
    return str(getattr(getattr(target, "_overloadpacket", None), "__name__", ""))


def _has_bias(target: Any) -> bool:
    """Whether ``target`` takes a bias as its third argument, added after its contraction."""
    aten = _torch().ops.aten
    return getattr(target, "_overloadpacket", None) in (aten.linear, aten.convolution)


def distribute_module(
    module: Any,
    plan: Plan | DTensorPlacements,
    *example_inputs: Any,
    mesh: Any = None,
    rows: bool = True,
    mode: str = "dtensor",
) -> DistributedModule:
    """``module`` with every parameter distributed as a DTensor in ``plan``'s placements, run
    (call the result with whole input tensors) so that every operator taps placed reads and makes
    its tensors in taps' placements.

    ``plan`` is a :class:`taps.Plan` of the graph :func:`taps.from_torch` makes of ``module`` on
    ``example_inputs`` (with the same ``rows``), or its :class:`DTensorPlacements`;
    ``mesh`` a ``DeviceMesh`` of ``plan.mesh.shape`` (default: ``init_device_mesh`` on the
    module's device type, with the plan's dim names). The process group must be initialised.

    ``mode="dtensor"`` lets DTensor do everything: each redistribution is one
    ``DTensor.redistribute`` from the producer's placements to the reader's, and each node runs
    as DTensor's sharding propagation decides. ``"taps"`` replays taps' plan exactly (needs a
    :class:`taps.Plan`): each edge through taps' own steps, one ``redistribute`` per
    step, and each node that made operators on the local blocks, its forward partial sum the
    redistribution to the output's placements (see :meth:`_Interpreter.local`).
    """
    torch = _torch()
    dtensor = require("torch.distributed.tensor", "torch", "distribute_module")
    from taps.frontends.torch import convert

    if mode not in MODES:
        raise ExportError(f"unknown mode {mode!r}: expected one of {MODES}")
    if not isinstance(plan, (Plan, DTensorPlacements)):
        raise TypeError(
            f"distribute_module: plan must be a taps.Plan or a DTensorPlacements, got "
            f"{type(plan).__name__}"
        )
    # The replay runs the plan as its step runs (the training step's mesh fits its backward
    # plans too); the placements are on that mesh.
    step = step_layouts(plan) if mode == "taps" and isinstance(plan, Plan) else None
    layouts = (
        step.layouts if step is not None else layouts_of(plan) if isinstance(plan, Plan) else None
    )
    if mode == "taps" and layouts is None:
        raise ExportError("mode='taps' needs a taps.Plan, not only its placements")
    placements = DTensorPlacements.from_layouts(layouts) if layouts is not None else plan
    assert isinstance(placements, DTensorPlacements)
    if not isinstance(module, torch.nn.Module):
        raise ExportError(f"distribute_module needs a torch.nn.Module, got {type(module).__name__}")
    try:
        program = torch.export.export(module, tuple(example_inputs))
    except Exception as e:  # torch raises many kinds; the user needs the message, once
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"torch.export failed on {type(module).__name__}: {first}") from None
    grads = [bool(getattr(x, "requires_grad", False)) for x in example_inputs]
    conversion = convert(program, "error", type(module).__name__, grads, rows)
    missing = sorted(set(placements.operators) ^ {op.name for op in conversion.graph.ops})
    if missing:
        raise ExportError(
            f"the plan is not of this module: operators {missing[:5]} are in one and not the other"
        )
    params = dict(module.named_parameters())
    if mesh is None:
        device = next(iter(params.values())).device.type if params else "cpu"
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(
            device, placements.mesh.shape, mesh_dim_names=placements.mesh.axis_names
        )
    if tuple(mesh.shape) != tuple(placements.mesh.shape):
        raise ExportError(
            f"the mesh has shape {tuple(mesh.shape)}, the plan {placements.mesh.shape}"
        )
    # Distributed as DTensor leaves by the module (``nn.Parameter`` would run DTensor's
    # sharding propagation, whose search grows exponentially with the mesh dims).
    parameters = {name: p for name, p in params.items()}
    replicate = [dtensor.Replicate()] * len(placements.mesh.shape)
    buffers = {
        str(spec.target): dtensor.distribute_tensor(
            _constant(program, str(spec.target)), mesh, replicate, src_data_rank=None
        )
        for spec in program.graph_signature.input_specs
        if spec.kind.name in ("BUFFER", "CONSTANT_TENSOR")
    }
    replay = Replay.of(step, mesh) if step is not None else None
    return DistributedModule(program, conversion, placements, mesh, parameters, buffers, replay)


def _constant(program: Any, target: str) -> Any:
    if target in program.state_dict:
        return program.state_dict[target]
    return program.constants[target]
