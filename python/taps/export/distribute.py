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
DTensor propagates them. The training-step replay (``mode="taps"``) carries every operator's
output as its blocks in taps' layout instead (:class:`Blocks`), which DTensor placements cannot
always express (a fused q, k, v projection split along its heads).

A placement list of the plan is per mesh dim over the dims of the operator's operand in the
graph; the node's argument views that graph tensor through a row-major reshape (rows: batch and
sequence seen as one dim) and a permutation. :func:`framework_placements` maps one onto the
other: a mesh dim that splits the top factor of a graph dim splits the top factor of the framework
dim that holds the same part of the flattened index.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from taps._core import GraphError, Layout, Redistribution
from taps._support.extras import require
from taps.errors import ExportError
from taps.export.batched import ATTENTION_FREE, MATMUL_FREE, batch_split
from taps.export.draws import DROPOUTS, attention, attention_args, drawn, draws, weights_shape
from taps.export.dtensor import (
    PARTIAL,
    REPLICATE,
    DTensorPlacements,
    layout_placements,
    placement_objects,
)
from taps.export.experts import stacked_parameters
from taps.frontends.torch.rules.creation import SHAPED
from taps.graph import SHARE, Graph
from taps.plan.layouts import PlanLayouts, layouts_of
from taps.plan.plan import Plan, unlike_names, unlike_operators
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


def nearest_placements(
    texts: Sequence[str],
    mesh_shape: Sequence[int],
    operand_shape: Sequence[int],
    graph_shape: Sequence[int],
    perm: Sequence[int],
) -> tuple[str, ...]:
    """:func:`framework_placements` of ``texts``, each split that has no DTensor form on the
    framework tensor (a fused QKV weight split by heads inside each of q, k and v) left whole:
    the framework tensor then holds a superset of taps' block and DTensor moves the rest.
    Mesh dims are kept in mesh order, each while the ones kept before it still have a form."""
    kept = [REPLICATE] * len(texts)
    for m, p in enumerate(texts):
        trial = [*kept[:m], p, *kept[m + 1 :]]
        try:
            framework_placements(trial, mesh_shape, operand_shape, graph_shape, perm)
        except ExportError:
            continue
        kept = trial
    return framework_placements(kept, mesh_shape, operand_shape, graph_shape, perm)


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


def block_shape(
    shape: Sequence[int], shard: Sequence[int], view: Sequence[int]
) -> list[int] | None:
    """The shape of a rank's block of a tensor of ``shape`` (blocks of ``shard``) seen as
    ``view``, a row-major reshape of it: the block reshaped to it is a sub-grid of ``view`` (one
    set of indices per dim), so torch nodes computing on several such blocks pair the right
    elements. ``None`` when a split is no product of ranges of the factors both shapes cut the
    flattened index into (or those do not nest). Weaker than a DTensor form: a split inside one
    dim of ``view`` (a fused q, k, v projection split by heads: 3 x 32 of 3 x 64) has a block."""
    if math.prod(shape) != math.prod(view) or 0 in shape:
        return None
    # The dims of both as factors of the flattened index, cut wherever either shape cuts it.
    cuts = sorted({math.prod(s[i:]) for s in (shape, view) for i in range(len(s) + 1)})[::-1]
    factors = list(itertools.pairwise(cuts))
    if any(hi % lo for hi, lo in factors):
        return None
    local: dict[int, int] = {}  # per factor (by its low cut), the block's size along it
    for i, (n, b) in enumerate(zip(shape, shard)):
        top, low, d = math.prod(shape[i:]), math.prod(shape[i + 1 :]), n // b
        for hi, lo in factors:
            if hi <= top and lo >= low:  # a factor of dim i, outermost first: it takes the split
                f = hi // lo
                if d % f == 0:
                    local[lo], d = 1, d // f
                elif f % d == 0:
                    local[lo], d = f // d, 1
                else:
                    return None
    out = []
    for j in range(len(view)):
        top, low = math.prod(view[j:]), math.prod(view[j + 1 :])
        out.append(math.prod(local[lo] for hi, lo in factors if hi <= top and lo >= low))
    return out


def _inverse(perm: Sequence[int]) -> list[int]:
    return [list(perm).index(g) for g in range(len(perm))]


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
        seed: the seed of the step's random values (dropout's masks: :mod:`taps.export.draws`),
            the same on every rank.
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
        seed: int = 0,
    ) -> None:
        self.program, self.conversion, self.chosen, self.mesh = program, conversion, chosen, mesh
        self.buffers = buffers
        self.replay = replay
        self.tracer = Tracer()
        #: Nodes another engine's code runs in the interpreter's place, by name: ``run(interpreter,
        #: node)`` gives the node's value (a verifier's mixture-of-experts blocks).
        self.nodes: dict[str, Callable[[Any, Any], Any]] = {}
        self.seed = seed
        self.leaves: dict[str, tuple[Any, Any]] = {}
        unplaced = sorted(set(parameters) - set(chosen.tensors))
        if unplaced:
            raise ExportError(f"the plan places no parameter {unplaced[:5]} of the module")
        #: Training-step replay: per parameter or input, each reader's block (a leaf of its own)
        #: and its layout (see :meth:`reader_block`), and the mesh axes the block is stored
        #: sharded over (FSDP, :meth:`stored_block`: the leaf is the rank's piece; else empty).
        self.readers: dict[str, list[tuple[Any, Layout, tuple[str, ...]]]] = {}
        #: The shapes of the inputs distributed (a reader's gradient is summed at this shape).
        self.inputs: dict[str, tuple[int, ...]] = {}
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

    def nearest(self, texts: Sequence[str], link: Link) -> list[Any]:
        """As :meth:`placements`, a split without a DTensor form left whole
        (:func:`nearest_placements`): what DTensor runs the node in."""
        return placement_objects(
            nearest_placements(
                texts, self.chosen.mesh.shape, link.operand_shape, link.graph_shape, link.perm
            )
        )

    def layout_placements(self, layout: Layout, link: Link) -> list[Any]:
        """The placement objects of the node's tensor a link names, in ``layout`` (of the
        linked operand, in any shape it can be reshaped to)."""
        return self.placements(layout_placements(self.chosen.mesh, layout), link, layout.shape)

    def distribute_input(self, name: str, value: Any) -> Any:
        """An input of the program as a DTensor in the plan's placements (each rank takes its
        block of the same whole tensor: no communication)."""
        texts = self.chosen.tensors.get(name, (REPLICATE,) * len(self.chosen.mesh.shape))
        self.inputs[name] = tuple(value.shape)
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

    def reader_block(self, x: Any, name: str, layout: Layout, link: Link, grad: bool) -> Any:
        """The block in ``layout`` of ``x``, the module's view of the parameter or input ``name``
        (the graph tensor of ``link``), which the training-step replay holds whole on every rank:
        taken locally (no communication), a leaf of its own when ``grad`` (its gradient summed
        into ``name``'s by :meth:`grad`); in the module's dims."""
        block = self._reader_block(x, layout, link)
        if grad:
            block = block.detach().requires_grad_(True)
            self.readers.setdefault(name, []).append((block, layout, ()))
        return Blocks(block, layout, link.graph_shape, link.perm, self).framework()

    def stored_block(
        self,
        x: Any,
        name: str,
        layout: Layout,
        link: Link,
        axes: tuple[str, ...],
        scope: Callable[[], AbstractContextManager[Any]],
    ) -> tuple[Any, Callable[[], Any]]:
        """As :meth:`reader_block` for a parameter its reader stores sharded over ``axes``
        (FSDP): the leaf is the rank's piece of the block (:meth:`Steps.piece`), all-gathered to
        the block (its gradient reduce-scattered back) in ``scope()``. Also the block gathered
        again from the piece, for the reader's backward."""
        assert self.replay is not None
        steps = self.replay.steps
        block = self._reader_block(x, layout, link).detach()
        shard = steps.piece(block, axes).detach().requires_grad_(True)
        self.readers.setdefault(name, []).append((shard, layout, axes))
        rows = block.shape[0]

        def view(b: Any) -> Any:
            return Blocks(b, layout, link.graph_shape, link.perm, self).framework()

        def again() -> Any:
            return view(steps.gathered(shard.detach(), axes, rows))

        return view(steps.stored(shard, axes, rows, scope)), again

    def _reader_block(self, x: Any, layout: Layout, link: Link) -> Any:
        """The block in ``layout`` of ``x`` (the module's view of a whole graph tensor)."""
        dtensor = require("torch.distributed.tensor", "torch", "distribute_module")
        whole = x.to_local() if isinstance(x, dtensor.DTensor) else x
        return self.block(whole.permute(_inverse(link.perm)).reshape(link.graph_shape), layout)

    def block(self, whole: Any, layout: Layout) -> Any:
        """This rank's block of ``whole`` (any row-major reshape of ``layout.shape``) in
        ``layout``, in its dims."""
        x = whole.reshape(layout.shape)
        for d, (start, stop) in enumerate(layout.shard_index(self.mesh.get_rank())):
            x = x.narrow(d, start, stop - start)
        return x

    def block_range(self, x: Blocks) -> tuple[list[int], list[int]]:
        """The sizes and the first index of this rank's block of ``x`` in the module's dims."""
        layout = x.layout
        shape = block_shape(layout.shape, layout.shard_shape, x.view)
        if shape is None:
            raise ExportError(f"the layout {layout!r} has no block on the module's {list(x.view)}")
        starts = [a for a, _ in layout.shard_index(self.mesh.get_rank())]
        flat = sum(s * st for s, st in zip(starts, _contiguous(layout.shape)))
        corner = [flat // st % n for n, st in zip(x.view, _contiguous(x.view))]
        return [shape[p] for p in x.perm], [corner[p] for p in x.perm]

    def gather(self, local: Any, layout: Layout) -> Any:
        """The whole tensor of ``layout`` from every rank's block ``local`` (an all_gather over
        every rank: for results, not part of the replayed step)."""
        if layout.partial:
            raise ExportError(f"cannot gather partial sums of {layout!r} as a whole tensor")
        import torch.distributed._functional_collectives as funcol

        assert self.replay is not None
        group = self.replay.steps.group(tuple(self.chosen.mesh.axis_names))
        flat = local.detach().contiguous().reshape(-1)
        every = funcol.wait_tensor(funcol.all_gather_single(flat, 0, group))
        whole = flat.new_zeros(layout.shape)
        for rank, piece in enumerate(every.chunk(group.size())):
            target = whole
            for d, (start, stop) in enumerate(layout.shard_index(rank)):
                target = target.narrow(d, start, stop - start)
            target.copy_(piece.reshape(layout.shard_shape))
        return whole

    def grad(self, name: str) -> Any:
        """The gradient of a parameter or input (by name) as a DTensor in its placements, or
        ``None`` (in the training-step replay, replicated: its readers' gradients summed)."""
        if self.readers.get(name):
            DTensor = require("torch.distributed.tensor", "torch", "grad").DTensor
            shape = self.parameters[name].shape if name in self.parameters else self.inputs[name]
            total = None
            for block, layout, axes in self.readers[name]:
                if block.grad is None:
                    continue
                grad = block.grad
                if axes:  # the pieces of a block stored sharded, gathered
                    assert self.replay is not None
                    grad = self.replay.steps.gathered(grad, axes, layout.shard_shape[0])
                whole = self.gather(grad, layout).reshape(shape)
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
                # (an expert's weight is read as its stacked experts', by the block's runner)
                name = self.conversion.aliases.get(target, target)
                args.append(self.parameters.get(name))
            elif kind == "USER_INPUT":
                x = next(users)
                if isinstance(x, torch.Tensor) and not isinstance(x, dtensor.DTensor):
                    x = self.distribute_input(spec.arg.name, x)
                args.append(x)
            else:
                args.append(self.buffers[target])
        out = _Interpreter(self).run(*args)
        out = [o.whole() if isinstance(o, _Pending) else _as_dtensor(o) for o in out]
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


@dataclass(frozen=True)
class Blocks:
    """A tensor of the training-step replay as each rank's block in a taps layout, whatever
    DTensor can express: ``local`` is the rank's block of the graph tensor in ``layout`` (graph
    dims, ``layout.shard_shape``), and the module's tensor is that graph tensor reshaped
    (row-major) to ``view`` and permuted by ``perm`` (its dim ``i`` is ``view``'s ``perm[i]``).
    An operator's output is one; views, transposes and splits carry it on; a node that is no
    operator of the plan gets it as a DTensor where its placements have a DTensor form
    (:meth:`dtensor`). A fused q, k, v projection split along its heads is a split inside one
    dim of the module's tensor: no DTensor placement, but a block (:func:`block_shape`)."""

    local: Any
    layout: Layout
    view: tuple[int, ...]
    perm: tuple[int, ...]
    dist: DistributedModule

    @property
    def shape(self) -> tuple[int, ...]:
        """The module's (global) shape of the tensor."""
        return tuple(self.view[p] for p in self.perm)

    def dim(self) -> int:
        return len(self.perm)

    def framework(self) -> Any:
        """The rank's block in the module's dims (what a torch node computes on)."""
        shape = block_shape(self.layout.shape, self.layout.shard_shape, self.view)
        if shape is None:
            raise ExportError(
                f"the layout {self.layout!r} has no block on the module's {list(self.view)}"
            )
        return self.local.reshape(shape).permute(list(self.perm))

    def with_local(self, local: Any) -> Blocks:
        """Other blocks of the same layout and view."""
        return Blocks(local, self.layout, self.view, self.perm, self.dist)

    def seen_as(self, view: Sequence[int], perm: Sequence[int]) -> Blocks:
        """The same blocks, the module's tensor now ``view`` permuted by ``perm``."""
        return Blocks(self.local, self.layout, tuple(view), tuple(perm), self.dist)

    def dtensor(self) -> Any:
        """The module's tensor as a DTensor (no communication), or an :class:`ExportError` when
        its split has no DTensor form."""
        dist = self.dist
        mesh = dist.chosen.mesh
        texts = framework_placements(
            layout_placements(mesh, self.layout),
            mesh.shape,
            self.layout.shape,
            self.view,
            self.perm,
        )
        dtensor = require("torch.distributed.tensor", "torch", "distribute_module")
        return dtensor.DTensor.from_local(
            self.framework(),
            dist.mesh,
            placement_objects(texts),
            run_check=False,
            shape=self.shape,
            stride=_contiguous(self.shape),
        )

    def full_tensor(self) -> Any:
        """The whole tensor in the module's dims, gathered from every rank (as
        ``DTensor.full_tensor``)."""
        whole = self.dist.gather(self.local, self.layout)
        return whole.reshape(self.view).permute(list(self.perm))


@dataclass(frozen=True)
class _Masked:
    """A parameter's dropout in the training-step replay, which holds parameters whole on every
    rank: ``value`` (the dropped-out DTensor the program carries) is ``pre`` (the parameter,
    through the same views) times ``mask`` (the scaled keep mask), both whole."""

    value: Any
    pre: Any
    mask: Any


@dataclass(frozen=True)
class _Cut:
    """A split (``split``, ``chunk``, ``unbind``) of :class:`Blocks`: its pieces are taken by
    the split operators that read them (:meth:`_Interpreter.piece`)."""

    of: Blocks
    node: Any


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
                out = super().run_node(n)
                outer.shadow_node(n, out)
                return out

            def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
                return outer.call(self.node, target, args, kwargs)

        self.interpreter = Run(dist.program.graph_module)
        aten = torch.ops.aten
        self.views = {aten.view, aten.reshape, aten._unsafe_view}
        self.permutes = {aten.transpose, aten.permute, aten.t}
        self.locals: dict[int, tuple[Any, Any]] = {}  # the DTensor kept: its id stays its own
        self.shares: dict[str, Blocks] = {}  # per share operator, the parameter's block
        #: The operator running: its blocks of parameters stored sharded (FSDP), each with the
        #: gather of it again (:meth:`DistributedModule.stored_block`).
        self.unit: list[tuple[Any, Callable[[], Any]]] = []
        #: The whole value of each integer or boolean node computed from whole values alone
        #: (ids, positions and masks made from the inputs), by name: see :meth:`shadow_node`.
        self.shadows: dict[str, Any] = {}
        #: Parameters dropped out, by the id of the DTensor the program carries.
        self.masked: dict[int, _Masked] = {}
        #: The program's draws of random values, numbered in program order.
        self.draws: dict[str, int] = {}
        for n in dist.program.graph.nodes:
            if n.op == "call_function" and draws(packet_name(n.target), n.args, n.kwargs):
                self.draws[n.name] = len(self.draws)

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
        texts = _texts(x.placements)
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
        x = args[0]
        order = _order(packet_name(target), x.dim(), args)
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

    def partial(self, x: Any) -> bool:
        """Whether ``x`` is a DTensor holding partial sums along some mesh dim."""
        return isinstance(x, self.dtensor.DTensor) and any(p.is_partial() for p in x.placements)

    def call(self, node: Any, target: Any, args: Any, kwargs: Any) -> Any:
        out = self._call(node, target, args, kwargs)
        if self.masked and not self.dist.conversion.links.get(node.name):
            self.carry_mask(target, args, kwargs, out)
        return out

    def carry_mask(self, target: Any, args: Any, kwargs: Any, out: Any) -> None:
        """A parameter dropped out (:class:`_Masked`) carried through a view or copy that is
        no operator of the plan: the same node on its undropped value and on its mask."""
        x = args[0] if args else None
        masked = self.masked.get(id(x))
        if masked is None or packet_name(target) not in _MASK_CARRIERS:
            return
        if not isinstance(out, self.dtensor.DTensor):
            return
        pre = target(masked.pre, *args[1:], **kwargs)
        mask = target(masked.mask, *args[1:], **kwargs)
        self.masked[id(out)] = _Masked(out, pre, mask)

    def _call(self, node: Any, target: Any, args: Any, kwargs: Any) -> Any:
        dist, tracer = self.dist, self.dist.tracer
        if node.name in dist.nodes:
            return dist.nodes[node.name](self, node)
        packet = getattr(target, "_overloadpacket", None)
        if packet_name(target).startswith("_assert"):
            return None  # export's checks of shapes, dtypes and devices: nothing to compute
        if packet_name(target) == "lift_fresh_copy":
            if isinstance(args[0], self.dtensor.DTensor):
                # A constant the module makes (``torch.tensor``): a copy of its replicated block
                # (DTensor has no rule for this op).
                x = args[0]
                return self.dtensor.DTensor.from_local(
                    self.local_of(x).clone(), dist.mesh, x.placements, run_check=False
                )
            return args[0]  # a constant of the program, already on every rank as it is
        if node.name in self.draws and packet_name(target) not in _DRAWING_OPERATORS:
            return self.draw(node, target, args, kwargs)
        links = dist.conversion.links.get(node.name, [])
        outputs = [link for link in links if link.slot is None]
        if args and isinstance(args[0], _Cut):
            return self.piece(node, args[0], args[1], outputs)
        blocks = any(isinstance(x, Blocks) for x in _leaves([*args, *kwargs.values()]))
        if blocks and not outputs:
            carried = self.carry(node, target, args)
            if carried is not None:
                return carried
            if packet_name(target) in SHAPED:
                # Made from the input's shape alone: its values, and so a split of them that
                # DTensor cannot express (Swin's window view split along the windows), do not
                # matter; a replicated stand-in has the shape, the dtype and no communication.
                args = [self.stand_in(x) if isinstance(x, Blocks) else x for x in args]
            # No operator of the plan: DTensor runs it (where the blocks have its form).
            args, kwargs = _dtensors(args), dict(zip(kwargs, _dtensors(list(kwargs.values()))))
        operator = dist.replay is not None and outputs  # a view of a permute: data moves
        if packet in self.views and isinstance(args[0], self.dtensor.DTensor) and not operator:
            out = self.view(args[0], args[1])
            if out is not None:
                return out
            if dist.replay is not None:
                return _Pending(args[0], tuple(int(d) for d in node.meta["val"].shape))
        if packet in self.permutes and isinstance(args[0], self.dtensor.DTensor) and not operator:
            return self.permute(node, target, args)
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
                    want = dist.nearest(ops[link.op]["inputs"][link.slot], link)
                    leaves[link.arg] = self._to(leaves[link.arg], want)
        if packet_name(target) in CONVOLUTIONS:
            for i, x in enumerate(leaves):
                if isinstance(x, self.dtensor.DTensor):
                    leaves[i] = self._to(x, self.convolution_placements(x, i))
        tree = _replace_leaves([*args, *kwargs.values()], leaves)
        with (
            tracer.scope("op", links[0].op, None)
            if links
            else tracer.scope("node", node.name, None)
        ):
            call_args, call_kwargs = tree[: len(args)], dict(zip(kwargs, tree[len(args) :]))
            out = self.on_batches(node, target, call_args, call_kwargs)
            if out is None:
                out = self.propagated(node, target, call_args, call_kwargs)
            for link in outputs:
                out = self._to(out, dist.nearest(ops[link.op]["output"], link))
                out = tracer.mark(out, link.op)
        return out

    def propagated(
        self, node: Any, target: Any, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> Any:
        """``target`` run as DTensor's sharding propagation decides; where DTensor has no rule
        for an op the node comes to (``adaptive_avg_pool2d`` of a 1x1 map decomposes into
        ``as_strided_``; DTensor refuses before it computes anything), run on every argument
        replicated, as a replicated result (the nearest placements with a form: each rank
        computes the whole node). Where DTensor's propagation fails otherwise, an
        :class:`ExportError` naming the node and its arguments' placements."""
        try:
            return target(*args, **kwargs)
        except NotImplementedError:
            pass
        except RuntimeError as e:
            placed = [
                f"{list(x.shape)} {_texts(x.placements)}"
                for x in _leaves([*args, *kwargs.values()])
                if isinstance(x, self.dtensor.DTensor)
            ]
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ExportError(
                f"node {node.name} ({packet_name(target)}): DTensor cannot run it on "
                f"{'; '.join(placed)}: {first}"
            ) from e
        DTensor, mesh = self.dtensor.DTensor, self.dist.mesh
        whole = [self.dtensor.Replicate()] * mesh.ndim
        leaves = [
            self._to(x, whole).to_local() if isinstance(x, DTensor) else x
            for x in _leaves([*args, *kwargs.values()])
        ]
        tree = _replace_leaves([*args, *kwargs.values()], leaves)
        out = target(*tree[: len(args)], **dict(zip(kwargs, tree[len(args) :])))
        made = [
            DTensor.from_local(y, mesh, whole, run_check=False)
            if isinstance(y, _torch().Tensor)
            else y
            for y in _leaves(out)
        ]
        return _replace_leaves(out, made)

    def on_batches(
        self, node: Any, target: Any, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> Any:
        """A batched ``matmul`` or attention whose operands are split along batch dims only (or
        a matmul's rows or columns, attention's query length), run on each rank's blocks
        (:func:`taps.export.batched.batch_split`: DTensor's own propagation flattens the batch
        dims, which it cannot undo for a dim split over several mesh dims, and searches its
        decomposition of attention slowly); ``None`` for any other node (DTensor runs it).
        Attention that drops some of its weights drops them by this rank's block of the
        step's mask (:mod:`taps.export.draws`), as the dense run under ``drawing`` does."""
        DTensor, name = self.dtensor.DTensor, packet_name(target)
        options: dict[str, Any] = {}
        if name == "matmul":
            operands, free = list(args[:2]), MATMUL_FREE
        elif name == "scaled_dot_product_attention":
            options = attention_args(args, kwargs)
            mask = options["attn_mask"]
            operands = [*args[:3], *([] if mask is None else [mask])]
            free = () if options["is_causal"] else ATTENTION_FREE
        else:
            return None
        if not all(isinstance(x, DTensor) and x.dim() >= 2 for x in operands):
            return None
        split = batch_split(
            [tuple(x.shape) for x in operands],
            [_texts(x.placements) for x in operands],
            tuple(self.dist.mesh.shape),
            bool(options.get("enable_gqa")),
            free,
        )
        val = node.meta["val"]
        if split is None or (node.name in self.draws and operands[0].shape[:-1] != val.shape[:-1]):
            return None  # (a mask broadcasting the query: the weights are no query's shape)
        read, out = split
        # Replicated operands read split are cut from their blocks: nothing moves.
        local = [self.local_of(self._to(x, placement_objects(p))) for x, p in zip(operands, read)]
        if node.name in self.draws:  # attention's dropout, its mask over the weights
            whole = drawn(
                name,
                node.args,
                node.kwargs,
                weights_shape(operands[0], operands[1]),
                self.dist.seed,
                self.draws[node.name],
            )
            keep = self.dtensor.distribute_tensor(
                whole.to(local[0]), self.dist.mesh, placement_objects(out), src_data_rank=None
            ).to_local()
            options["attn_mask"] = local[3] if len(local) > 3 else None
            result = attention(local[0], local[1], local[2], keep, **options)
        elif name == "matmul":
            result = target(*local, *args[2:], **kwargs)
        else:
            options["attn_mask"] = local[3] if len(local) > 3 else None
            result = target(*local[:3], **options)
        return DTensor.from_local(
            result,
            self.dist.mesh,
            placement_objects(out),
            run_check=False,
            shape=tuple(val.shape),
            stride=tuple(val.stride()),
        )

    def convolution_placements(self, x: Any, arg: int) -> list[Any]:
        """The nearest placements of a convolution's argument ``arg`` that DTensor's rule for
        convolutions computes right: the input split along its batch dim only, the weight and
        the bias whole. The rule passes the input's placements on to the output whatever the
        weight's, so a split of the output or input channels (a depthwise convolution's
        groups too) would make an output whose blocks are not what its placements say."""
        whole = self.dtensor.Replicate()
        return [p if arg == 0 and p.is_shard(0) else whole for p in x.placements]

    def draw(self, node: Any, target: Any, args: Any, kwargs: Any) -> Any:
        """A draw of random values (:mod:`taps.export.draws`): the whole value drawn from the
        run's seed, this rank's block of it taken in the placement of the tensor it is drawn
        for (a dropout multiplies its input's block by its block of the mask)."""
        dist, DTensor = self.dist, self.dtensor.DTensor
        name = packet_name(target)
        val = node.meta["val"]
        whole = drawn(name, args, kwargs, tuple(val.shape), dist.seed, self.draws[node.name])
        x = args[0] if args and name != "rand" else None
        if isinstance(x, _Pending):
            x = x.whole()
        dropout = name in DROPOUTS
        if isinstance(x, Blocks) and (dropout or not x.layout.partial):
            block = dist.block(whole.permute(_inverse(x.perm)), x.layout).to(x.local)
            return x.with_local(x.local * block if dropout else block)
        if isinstance(x, Blocks):
            x = x.dtensor()
        if isinstance(x, DTensor):
            local = self.local_of(x)
            kept = [self.dtensor.Replicate() if p.is_partial() else p for p in x.placements]
            block = self.dtensor.distribute_tensor(
                whole.to(local), dist.mesh, kept, src_data_rank=None
            ).to_local()
            if dropout and self.leaf_read(x):
                made = DTensor.from_local(
                    local * block,
                    dist.mesh,
                    x.placements,
                    run_check=False,
                    shape=x.shape,
                    stride=x.stride(),
                )
                before = self.masked.get(id(x))
                pre, mask = (local, block) if before is None else (before.pre, before.mask * block)
                self.masked[id(made)] = _Masked(made, pre, mask)
                return made
            return DTensor.from_local(
                local * block if dropout else block,
                dist.mesh,
                x.placements if dropout else kept,
                run_check=False,
                shape=x.shape,
                stride=x.stride(),
            )
        like = next(iter([*dist.parameters.values(), *dist.buffers.values()]), None)
        device = like.to_local().device if like is not None else "cpu"
        whole = whole.to(dtype=val.dtype, device=device)
        return x * whole.to(x) if dropout else whole

    def attending(self, node: Any, args: Any, kwargs: Any, out: Blocks) -> Any:
        """Attention that drops some of its weights, on this rank's blocks (``args``, its
        output's blocks ``out``): written out (:func:`attention`) with this rank's block of the
        step's mask over the weights (torch's kernel would draw its own, per rank)."""
        query, key = args[0], args[1]
        whole = drawn(
            packet_name(node.target),
            node.args,
            node.kwargs,
            weights_shape(node.args[0].meta["val"], node.args[1].meta["val"]),
            self.dist.seed,
            self.draws[node.name],
        )
        if key.shape[-2] != whole.shape[-1]:
            raise ExportError(
                f"node {node.name}: attention's dropout over keys split across devices is not "
                "replayed"
            )
        sizes, offsets = self.dist.block_range(out)
        for d in range(whole.dim() - 1):  # the weights' dims but the keys are the output's
            if sizes[d] != whole.shape[d]:
                whole = whole.narrow(d, offsets[d], sizes[d])
        keep = whole.to(query)
        options = attention_args(args, kwargs)

        def run(*_: Any, **__: Any) -> Any:
            return attention(query, key, args[2], keep, **options)

        return run

    def shadow_node(self, node: Any, out: Any) -> None:
        """Keep ``node``'s whole value when it is an integer or boolean tensor made from the
        inputs held whole on every rank (the training-step replay holds them so) by nodes of
        the same kind: computed again here on whole values, which is little work (ids,
        positions, masks). An in-place write into a tensor that is no operator's output reads
        them (:meth:`write_whole`)."""
        torch, DTensor = _torch(), self.dtensor.DTensor
        replay = self.dist.replay
        if replay is None or not replay.training:
            return
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.is_floating_point() or val.is_complex():
            return
        if node.op == "placeholder":
            whole = isinstance(out, torch.Tensor) and not isinstance(out, DTensor)
            if isinstance(out, DTensor) and all(p.is_replicate() for p in out.placements):
                out, whole = self.local_of(out), True
            if whole:
                self.shadows[node.name] = out.clone()
            return
        if node.op != "call_function":
            return
        args = self.shadowed([*node.args, *node.kwargs.values()])
        if args is not None:
            n = len(node.args)
            self.shadows[node.name] = node.target(*args[:n], **dict(zip(node.kwargs, args[n:])))

    def shadowed(self, args: Sequence[Any]) -> list[Any] | None:
        """``args`` (a node's, fx nodes among them) with every node as its whole value
        (:attr:`shadows`), or ``None`` when one has none."""
        torch = _torch()
        fx = torch.fx
        nodes = [a for a in _leaves(list(args)) if isinstance(a, fx.Node)]
        if any(a.name not in self.shadows for a in nodes):
            return None
        return list(fx.node.map_arg(list(args), lambda a: self.shadows[a.name]))

    def write_whole(self, node: Any, target: Any, dest: Any) -> None:
        """An in-place operator writing into ``dest``, a whole integer tensor held on every
        rank that is no operator's output (BART's decoder ids: ``new_zeros``, then the ids
        copied into a slice of it): the write made on the whole of ``dest`` from the whole
        values of its other arguments (:meth:`shadow_node`), as the dense module makes it; the
        operator itself runs on its blocks (whose readers, if any, the plan feeds)."""
        torch, DTensor = _torch(), self.dtensor.DTensor
        if isinstance(dest, DTensor):
            if not all(p.is_replicate() for p in dest.placements):
                return
            dest = self.local_of(dest)
        if not isinstance(dest, torch.Tensor) or dest.is_floating_point():
            return
        rest = self.shadowed([*node.args[1:], *node.kwargs.values()])
        if rest is None:
            return
        n = len(node.args) - 1
        target(dest, *rest[:n], **dict(zip(node.kwargs, rest[n:])))

    def leaf_read(self, x: Any) -> bool:
        """Whether DTensor ``x`` is a parameter that the training-step replay holds whole on
        every rank (or such a parameter dropped out already): a reader takes its block of it
        (:meth:`local_input`), and a dropout between them must reach its gradient."""
        replay = self.dist.replay
        if replay is None or not replay.training:
            return False
        return id(x) in self.masked or any(x is p for p in self.dist.parameters.values())

    def stand_in(self, x: Blocks) -> Any:
        """A replicated DTensor of ``x``'s shape and dtype, its values unset: for an operator
        that reads only those."""
        dtensor = self.dtensor
        local = x.local.new_empty(x.shape)
        placements = [dtensor.Replicate()] * self.dist.mesh.ndim
        return dtensor.DTensor.from_local(local, self.dist.mesh, placements, run_check=False)

    def carry(self, node: Any, target: Any, args: Any) -> Blocks | _Cut | None:
        """A node that is no operator of the plan run on :class:`Blocks` without computing:
        a view (of a tensor whose dims are in the graph tensor's order), a transpose,
        ``unsqueeze``/``squeeze``, a copy, a dropout that drops nothing, a padding by nothing,
        or a split (its pieces taken by the operators reading them); ``None`` for anything
        else."""
        x, name = args[0], packet_name(target)
        if not isinstance(x, Blocks):
            return None
        val = node.meta.get("val")
        if name in ("view", "reshape", "_unsafe_view", "unflatten", "flatten"):
            seen = _reshaped(x.view, x.perm, [int(d) for d in val.shape])
            return None if seen is None else x.seen_as(*seen)
        if name in ("transpose", "permute", "t"):
            return x.seen_as(x.view, [x.perm[d] for d in _order(name, x.dim(), args)])
        if name == "unsqueeze":
            perm = list(x.perm)
            perm.insert(args[1] % (x.dim() + 1), len(x.view))
            return x.seen_as((*x.view, 1), perm)
        if name == "squeeze":
            dims = args[1] if len(args) > 1 else range(x.dim())
            dims = [d % x.dim() for d in ([dims] if isinstance(dims, int) else dims)]
            gone = {x.perm[d] for d in dims if x.shape[d] == 1}
            keep = [v for v in range(len(x.view)) if v not in gone]
            view = [x.view[v] for v in keep]
            return x.seen_as(view, [keep.index(p) for p in x.perm if p not in gone])
        if (
            name in ("contiguous", "clone", "alias")
            or (name in DROPOUTS and (args[1] == 0 or not args[2]))
            or (name == "pad" and not any(args[1]))
        ):
            return x
        if name in ("split", "split_with_sizes", "chunk", "unbind"):
            return _Cut(x, node)
        return None

    def piece(self, node: Any, cut: _Cut, index: int, outputs: list[Link]) -> Any:
        """Piece ``index`` of a split of :class:`Blocks`: the split operator's input taken to its
        layout by taps' edge, and the piece cut from its local block along the split dim (which
        the split operator keeps whole)."""
        dist = self.dist
        replay = dist.replay
        if not outputs or replay is None:
            raise ExportError(f"node {node.name} takes a piece no operator of the plan reads")
        out = outputs[0]
        op = dist.graph.op(out.op)
        local = self.edge_block(cut.of, out.op, 0)
        ins, outs = op.inputs[0].dims, op.output.dims
        pieces = [tuple(v.shape) for v in cut.node.meta["val"]]
        with dist.tracer.scope("op", out.op, None):
            k = next(i for i, d in enumerate(ins) if d not in outs)
            if len(outs) < len(ins):  # one index of a dim (unbind, or equal pieces as a dim)
                local = local.select(k, index)
                now = [d for i, d in enumerate(ins) if i != k]
            else:  # a range of a dim (the piece's dim named anew)
                at = next(i for i, (a, b) in enumerate(zip(cut.of.shape, pieces[index])) if a != b)
                start = sum(p[at] for p in pieces[:index])
                local = local.narrow(k, start, pieces[index][at])
                new = next(o for o in outs if o not in ins)
                now = [new if i == k else d for i, d in enumerate(ins)]
            # The operator may order its output's dims unlike its input's (timm's unbind of q,
            # k and v after a permute: its input is the projection's reshape, unpermuted).
            local = local.permute([now.index(d) for d in outs])
        return self.made(local, replay.layouts.outputs[out.op], out)

    def made(self, local: Any, layout: Layout, out: Link) -> Blocks:
        """An operator's output, its block ``local`` in ``layout`` (reshaped to its block
        shape), marked for the backward pass."""
        local = self.dist.tracer.mark(local.reshape(layout.shard_shape), out.op)
        return Blocks(local, layout, out.graph_shape, out.perm, self.dist)

    def edge_block(self, x: Blocks, op: str, slot: int) -> Any:
        """The block of ``x`` taken by the edge into ``op``'s input ``slot`` (taps' forward plan;
        backward, its backward plan) to the block of the slot's layout, in the graph dims."""
        replay = self.dist.replay
        assert replay is not None
        plan = replay.redistributions[(op, slot)]
        if x.layout.normalized() != plan.source.normalized():
            raise ExportError(
                f"operator {op!r} input {slot} reads {x.layout!r}; taps' plan starts from "
                f"{plan.source!r}"
            )

        def scope() -> AbstractContextManager[Any]:
            return self.dist.tracer.scope("edge", op, slot)

        with scope():  # forward here (a split's piece calls this outside the edge's scope)
            local = replay.steps.edge(x.local, plan, replay.backward.get((op, slot)), scope)
        # The plan's target may be the slot's layout in another shape (a reshape moves nothing).
        return local.reshape(replay.layouts.inputs[op][slot].shard_shape)

    def shared(self, op: str) -> Blocks:
        """The parameter a ``share`` operator hands on, as its block in the share operator's
        layout: one leaf for every use, so the gradients its uses' edges carry back (each
        reduced by its backward plan, as taps prices them) add up on it."""
        if op not in self.shares:
            dist = self.dist
            name = dist.graph.op(op).inputs[0].tensor
            layout = dist.replay.layouts.outputs[op]  # type: ignore[union-attr]
            param = dist.parameters[name]
            block = dist.block(param.to_local(), layout).detach()
            if dist.graph.tensors[name].requires_grad:
                block.requires_grad_(True)
                dist.readers.setdefault(name, []).append((block, layout, ()))
            whole = tuple(layout.shape)
            self.shares[op] = Blocks(block, layout, whole, tuple(range(len(whole))), dist)
        return self.shares[op]

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
        replay, mesh, graph = dist.replay, dist.chosen.mesh, dist.graph
        assert replay is not None and link.slot is not None
        plan = replay.redistributions.get((link.op, link.slot))
        ours = replay.layouts.inputs[link.op][link.slot]
        producer = graph.root(graph.op(link.op).inputs[link.slot].tensor).producer
        c = replay.gradients.get((link.op, link.slot)) if replay.training else None
        stored = c is not None and c.kind == "reduce_scatter"  # FSDP: the unit's gathers
        # A parameter dropped out: the reader takes its block of the parameter (its gradient
        # the parameter's) times its block of the mask.
        masked = self.masked.get(id(x)) if replay.training else None
        keep = None

        def scope() -> AbstractContextManager[Any]:
            return dist.tracer.scope("op", link.op, None)

        with dist.tracer.scope("edge", link.op, link.slot):
            first = (
                None if plan is None else plan.all_ops[0].layout if plan.all_ops else plan.target
            )
            if isinstance(x, _Pending) and not (first and self.holds(x.x, first)):
                x = x.whole()
            if replay.training and producer is not None and graph.op(producer).kind == SHARE:
                x = self.shared(producer)
                keep = masked
            if isinstance(x, Blocks) and replay.training:
                local = self.edge_block(x, link.op, link.slot)
                local = Blocks(local, ours, link.graph_shape, link.perm, dist).framework()
            elif plan is not None and first is not None:
                rank = len(link.perm)
                if isinstance(x, _Pending):
                    local = self.local_of(x.x)  # the block of the plan's source, in its own order
                else:
                    x = self._to(x, dist.layout_placements(first, link))
                    local = self.local_of(x).permute(_inverse(link.perm))
                if replay.training:
                    local = replay.steps.edge(
                        local,
                        plan,
                        replay.backward.get((link.op, link.slot)),
                        lambda: dist.tracer.scope("edge", link.op, link.slot),
                    )
                else:
                    local = replay.steps.walk(local, plan)
                local = Blocks(local, ours, link.graph_shape, link.perm, dist).framework()
                assert local.dim() == rank
            elif replay.training:
                # A parameter or input: each reader takes its block of the whole (no edge).
                root = graph.root(graph.op(link.op).inputs[link.slot].tensor)
                whole = x.whole() if isinstance(x, _Pending) else x
                if masked is not None and not stored:
                    whole, keep = masked.pre, masked
                if stored:
                    assert c is not None
                    axes = mesh.unused_axes(c.layout)
                    local, again = dist.stored_block(whole, root.name, ours, link, axes, scope)
                    self.unit.append((local, again))
                else:
                    local = dist.reader_block(
                        whole,
                        root.name,
                        ours,
                        link,
                        root.name in dist.readers and root.requires_grad,
                    )
            else:
                # A parameter or input read here in another layout than at its first reader:
                # taps places it for each reader (no edge); the move has a scope of its own.
                with dist.tracer.scope("leaf", link.op, link.slot):
                    local = self.local_of(self._to(x, dist.layout_placements(ours, link)))
        if keep is not None:
            mask = dist._reader_block(keep.mask, ours, link)
            local = local * Blocks(mask, ours, link.graph_shape, link.perm, dist).framework()
        if replay.training:
            if c is None or stored:
                return local
            return replay.steps.gradient_sync(local, mesh.unused_axes(c.layout), c.zero, scope)
        with dist.tracer.scope("op", link.op, None):
            lacks = replay.used[link.op] - mesh.used_axes(ours)
            return replay.steps.sum_grad(local, _ordered(mesh.axis_names, lacks))

    @staticmethod
    def _unsaved(
        unit: list[tuple[Any, Callable[[], Any]]], again: dict[int, Any]
    ) -> AbstractContextManager[Any]:
        """While the operator runs, autograd keeps each gathered block of ``unit`` (FSDP) as a
        reference to ``again``, which its pre-backward gather fills: the forward's gathered
        blocks are not kept (``reshard_after_forward=True``)."""
        if not unit:
            return nullcontext()

        def base(t: Any) -> Any:
            return t if t._base is None else t._base

        def pack(t: Any) -> Any:
            # The operator keeps views of the block (a linear its transpose): kept as where
            # they are in the block's storage, which the gather again makes alike.
            k = next((k for k, (b, _) in enumerate(unit) if base(t) is base(b)), None)
            return t if k is None else (k, t.size(), t.stride(), t.storage_offset())

        def unpack(x: Any) -> Any:
            if not isinstance(x, tuple):
                return x
            k, size, stride, offset = x
            return base(again[k]).as_strided(size, stride, offset)

        return _torch().autograd.graph.saved_tensors_hooks(pack, unpack)

    def _aligned(
        self,
        x: Any,
        linked: dict[int, tuple[tuple[int, ...], Layout, Link]],
        shape: tuple[int, ...],
        out: Blocks,
        start: int | None = None,
    ) -> Any:
        """A whole tensor the operator reads beside its graph operands (a buffer, a constant
        table) as the rank's block of it: in the layout of a linked input of its shape
        (BatchNorm's running statistics, shaped as its weight) unless it has the output's
        shape, else cut where it broadcasts against a split dim of the output ``out`` (rotary
        tables, masks, a gather's index; its dims are the output's from ``start`` on, by
        default its trailing ones, as broadcasting aligns them)."""
        same = next(((lay, li) for s, lay, li in linked.values() if s == tuple(x.shape)), None)
        if same is not None and tuple(x.shape) != shape:  # shaped as the output: cut as it
            layout, link = same
            graph = x.detach().permute(_inverse(link.perm)).reshape(link.graph_shape)
            return Blocks(
                self.dist.block(graph, layout), layout, link.graph_shape, link.perm, self.dist
            ).framework()
        sizes, offsets = self.dist.block_range(out)
        lead = len(shape) - x.dim() if start is None else start
        for d in range(max(0, -lead), x.dim()):
            o = d + lead
            if x.shape[d] == shape[o] and sizes[o] != shape[o]:
                x = x.narrow(d, offsets[o], sizes[o])
        return x

    def local(self, node: Any, target: Any, leaves: list[Any], links: list[Link], out: Link) -> Any:
        """The node run on each rank's blocks, as taps' plan runs it (:class:`Replay`): every
        input in the operator's layout, the result summed over the operator's forward partial
        sum (a linear layer's bias added after it); in the training step the result's blocks
        (:class:`Blocks`), else a DTensor in the output's placements."""
        DTensor, dist, torch = self.dtensor.DTensor, self.dist, _torch()
        replay, mesh = dist.replay, dist.chosen.mesh
        assert replay is not None
        self.unit = []
        partial = replay.partial[out.op]
        flowing = replay.flowing.get(out.op)
        bias = None
        split = partial or flowing
        at = _bias_arg(target)
        if split and at is not None and len(leaves) > at and leaves[at] is not None:
            bias, leaves = leaves[at], [*leaves[:at], None, *leaves[at + 1 :]]
        val = node.meta["val"]
        layout = (
            replay.layouts.plan.candidates[out.op].partial_output
            if flowing is not None
            else replay.layouts.outputs[out.op]
        )
        result_blocks = Blocks(None, layout, out.graph_shape, out.perm, dist)
        local: list[Any] = []
        linked: dict[int, tuple[tuple[int, ...], Layout, Link]] = {}  # the linked inputs
        for k, x in enumerate(leaves):
            link = next((li for li in links if li.slot is not None and li.arg == k), None)
            if link is not None and isinstance(x, (torch.Tensor, _Pending, Blocks)):
                local.append(self.local_input(x, link))
                assert link.slot is not None
                ours = replay.layouts.inputs[link.op][link.slot]
                linked[k] = (tuple(x.shape), ours, link)
            else:
                x = (
                    x.whole()
                    if isinstance(x, _Pending)
                    else x.dtensor()
                    if isinstance(x, Blocks)
                    else x
                )
                local.append(self.local_of(x) if isinstance(x, DTensor) else x)
        packet = packet_name(target)
        if packet.endswith("_") and 0 not in linked and leaves:
            self.write_whole(node, target, leaves[0])
        starts = _index_dims(packet, node.args)
        if bias is not None and at == 0:  # addmm's bias, added after the partial sums
            local[0] = local[1].new_zeros(())
        args = _leaves([*node.args, *node.kwargs.values()])
        for k, x in enumerate(local):
            if k not in linked and isinstance(x, torch.Tensor) and x.dim() > 0:
                if x.numel() == 0 and isinstance(args[k], torch.fx.Node):
                    # No data (Phi-3's rotary pass-through of no dims): cut from its whole shape
                    # as any other, whatever block DTensor made of it.
                    x = x.new_empty(args[k].meta["val"].shape)
                local[k] = self._aligned(x, linked, tuple(val.shape), result_blocks, starts.get(k))
            elif k == 0 and packet.endswith("_") and isinstance(x, torch.Tensor):
                local[k] = x.clone()  # an in-place operator (relu_) writes a copy of its input
        if packet in _SIZED:  # its sizes (after the input) are the output's: the block's
            shape = dist.block_range(result_blocks)[0]
            for i, size in enumerate(shape):
                local[1 + i] = size
            if packet == "view":  # of a block, which a permute before may leave strided
                target = torch.ops.aten.reshape.default
        if packet == "repeat":  # its counts: the output's block over the input's
            shape = dist.block_range(result_blocks)[0]
            have = [1] * (len(shape) - local[0].dim()) + list(local[0].shape)
            for i, (size, n) in enumerate(zip(shape, have)):
                local[1 + i] = size // n
        share = _mean_share(node, leaves[0], local[0]) if packet == "mean" else 1.0
        inside = None
        if packet == "embedding" and 0 in linked:  # rows of the table split: each rank its own
            ours = linked[0][1]
            start, stop = ours.shard_index(dist.mesh.get_rank())[0]
            if stop - start < ours.shape[0]:
                ids = local[1]
                inside = (ids >= start) & (ids < stop)
                local[1] = torch.where(inside, ids - start, torch.zeros_like(ids))
        tree = _replace_leaves(list(node.args) + list(node.kwargs.values()), local)
        n = len(node.args)
        grouped = _groups_arg(packet, node)
        if grouped is not None and isinstance(tree[grouped], int) and tree[grouped] > 1:
            # A grouped convolution's groups split over devices: each rank convolves its own.
            op = dist.graph.op(out.op)
            degrees = dict(zip(op.partitionable, replay.layouts.plan.strategies[out.op].degrees))
            tree[grouped] //= degrees.get("g", 1)
        if packet in _DRAWING_OPERATORS and node.name in self.draws:
            target = self.attending(node, tree[:n], dict(zip(node.kwargs, tree[n:])), result_blocks)
        unit = self.unit
        again: dict[int, Any] = {}
        with dist.tracer.scope("op", out.op, None), self._unsaved(unit, again):
            result = target(*tree[:n], **dict(zip(node.kwargs, tree[n:])))
            if packet == "mean":
                result = result * share
            if inside is not None:  # a row another rank holds adds nothing to the partial sum
                result = result * inside.unsqueeze(-1).to(result.dtype)
            result = replay.steps.sum(result, partial)
            if bias is not None and replay.training:
                link = next(li for li in links if li.slot is not None and li.arg == at)
                b = self.local_input(bias, link)
                if packet in _CONVOLUTIONS:  # a bias per channel
                    b = b.reshape(-1, *([1] * (result.dim() - 2)))
                result = replay.steps.add_once(result, b, flowing or ())
            elif bias is not None:
                link = next(li for li in links if li.slot is not None and li.arg == at)
                layout = replay.layouts.outputs[out.op]
                used = {a for axes in mesh.dim_axes(layout) for a in axes}
                assert link.slot is not None
                ours = replay.layouts.inputs[link.op][link.slot]
                b = self.local_of(self._to(bias, dist.layout_placements(ours, link)))
                held = {a for axes in mesh.dim_axes(ours) for a in axes}
                result = result + replay.steps.sum_grad(b, _ordered(mesh.axis_names, used - held))
            if unit:  # FSDP: the blocks gathered again before the operator's backward

                def fetch() -> None:
                    with dist.tracer.scope("op", out.op, None):
                        again.update({k: f() for k, (_, f) in enumerate(unit)})

                result = replay.steps.before_backward(result, fetch)
            if replay.training:
                return self.made(result.permute(_inverse(out.perm)), result_blocks.layout, out)
            made = DTensor.from_local(
                result,
                dist.mesh,
                dist.placements(dist.chosen.operators[out.op]["output"], out),
                run_check=False,
                shape=tuple(val.shape),
                stride=tuple(val.stride()),
            )
            return dist.tracer.mark(made, out.op)


#: The convolutions: a bias per output channel, the third argument.
_CONVOLUTIONS = ("convolution", "conv1d", "conv2d", "conv3d")


def _groups_arg(packet: str, node: Any) -> int | None:
    """Where a convolution node's ``groups`` is among its arguments then keyword arguments
    (``None``: no convolution, or its default of 1)."""
    from taps.frontends.torch.rules.convolution import groups_position

    if packet not in CONVOLUTIONS:
        return None
    at = groups_position(packet)
    if at < len(node.args):
        return at
    if "groups" in node.kwargs:
        return len(node.args) + list(node.kwargs).index("groups")
    return None


#: Nodes that carry a dropped-out parameter to its reader as they carry its mask.
_MASK_CARRIERS = (
    "alias",
    "view",
    "reshape",
    "_unsafe_view",
    "unsqueeze",
    "squeeze",
    "permute",
    "transpose",
    "t",
    "expand",
    "contiguous",
    "clone",
    "to",
    "_to_copy",
)

#: Operators of the plan that draw random values inside (the rest of the draws are no operator).
_DRAWING_OPERATORS = ("scaled_dot_product_attention",)

#: Operators whose arguments after the input are the output's sizes (a view of a permuted
#: tensor merging its dims is an operator: its data moves).
_SIZED = ("expand", "broadcast_to", "view", "reshape", "_unsafe_view")


def _index_dims(packet: str, args: Sequence[Any]) -> dict[int, int]:
    """Per argument (by leaf) holding indices, the output dim its dims start at: an
    embedding's ids are its output's leading dims; ``index``'s tensors (broadcast together)
    sit where the dims they index were, or first when those are not adjacent."""
    if packet == "embedding":
        return {1: 0}
    if packet != "index":
        return {}
    indices = list(args[1])
    pos = [i for i, t in enumerate(indices) if t is not None]
    if not pos:
        return {}
    first = pos[0] if pos == list(range(pos[0], pos[-1] + 1)) else 0
    rank = max(len(indices[i].meta["val"].shape) for i in pos)
    return {1 + i: first + rank - len(indices[i].meta["val"].shape) for i in pos}


def _order(name: str, rank: int, args: Any) -> list[int]:
    """The dims of a ``transpose``, ``permute`` or ``t``'s input, in its output's order."""
    if name == "permute":
        return [d % rank for d in args[1]]
    if name == "t" or rank < 2:
        return list(range(rank))[::-1]
    order = list(range(rank))
    a, b = args[1] % rank, args[2] % rank
    order[a], order[b] = order[b], order[a]
    return order


def _texts(placements: Sequence[Any]) -> tuple[str, ...]:
    """DTensor placement objects as text (``"Shard(1)"``, ``"Partial()"``, ``"Replicate()"``)."""
    return tuple(
        f"Shard({p.dim})" if p.is_shard() else PARTIAL if p.is_partial() else REPLICATE
        for p in placements
    )


def _as_dtensor(x: Any) -> Any:
    """An output's :class:`Blocks` as a DTensor where its split has a DTensor form (kept as
    blocks where not: :meth:`Blocks.full_tensor` gathers them)."""
    if not isinstance(x, Blocks):
        return x
    try:
        return x.dtensor()
    except ExportError:
        return x


def _reshaped(
    view: Sequence[int], perm: Sequence[int], shape: Sequence[int]
) -> tuple[list[int], list[int]] | None:
    """A tensor that is ``view`` permuted by ``perm``, reshaped (row-major) to ``shape``, as a
    view and a permutation again: each run of its dims that the reshape merges must be
    consecutive dims of ``view`` in order (a split needs nothing); ``None`` when not."""
    now = [view[p] for p in perm]
    dims = [(now[i], perm[i]) for i in range(len(perm)) if now[i] != 1]
    new = [j for j, g in enumerate(shape) if g != 1]
    groups, i, j = [], 0, 0
    while i < len(dims):
        a, b, pa, pb = i + 1, j + 1, dims[i][0], shape[new[j]]
        while pa != pb:
            if pa < pb:
                pa, a = pa * dims[a][0], a + 1
            else:
                pb, b = pb * shape[new[b]], b + 1
        groups.append(([v for _, v in dims[i:a]], new[j:b]))
        i, j = a, b
    parts: dict[int, list[int]] = {}
    for vs, gs in groups:
        if vs != list(range(vs[0], vs[0] + len(vs))):
            return None
        parts[vs[0]] = gs
    out: list[int] = []
    pos: dict[int, int] = {}
    for v in sorted(parts):
        for g in parts[v]:
            pos[g] = len(out)
            out.append(shape[g])
    for g, size in enumerate(shape):
        if size == 1:
            pos[g] = len(out)
            out.append(1)
    return out, [pos[g] for g in range(len(shape))]


def _dtensors(tree: Any) -> Any:
    """``tree`` with every :class:`Blocks` as a DTensor."""
    if isinstance(tree, (list, tuple)):
        return type(tree)(_dtensors(t) for t in tree)
    return tree.dtensor() if isinstance(tree, Blocks) else tree


def _mean_share(node: Any, whole: Any, block: Any) -> float:
    """The share of a mean's elements a rank's block holds: the local mean over a split dim,
    scaled by it, sums over the ranks to the mean (torch divides by the local count)."""
    rank = len(whole.shape)
    dims = node.args[1] if len(node.args) > 1 and node.args[1] is not None else range(rank)
    dims = [int(d) % rank for d in dims]
    return math.prod(block.shape[d] for d in dims) / math.prod(whole.shape[d] for d in dims)


def _ordered(names: Sequence[str], chosen: set[str]) -> tuple[str, ...]:
    return tuple(a for a in names if a in chosen)


#: The aten convolutions (their packet names), whose DTensor rule passes the input's placements
#: to the output (:meth:`_Interpreter.convolution_placements`).
CONVOLUTIONS = frozenset({"conv1d", "conv2d", "conv3d", "convolution", "_convolution"})


def packet_name(target: Any) -> str:
    """The name of an aten operator's overload packet (``"transpose"``)."""
    return str(getattr(getattr(target, "_overloadpacket", None), "__name__", ""))


def _bias_arg(target: Any) -> int | None:
    """The argument of ``target`` that is a bias added after its contraction (a linear's or a
    convolution's third, ``addmm``'s first), or ``None``."""
    packet = packet_name(target)
    return 2 if packet in ("linear", *_CONVOLUTIONS) else 0 if packet == "addmm" else None


@dataclass(frozen=True)
class Exported:
    """A module's ``torch.export`` program and the torch front end's conversion of it: what
    :func:`distribute_module` runs (see :func:`export_module`)."""

    program: Any
    conversion: Conversion


def export_module(module: Any, *example_inputs: Any, rows: bool = True) -> Exported:
    """``module`` exported on ``example_inputs`` and converted as :func:`taps.from_torch` does
    (with the same ``rows``), an operator without a rule an error."""
    from taps.frontends.torch import convert, export_program

    try:
        program = export_program(module, example_inputs)
    except GraphError as e:
        raise ExportError(str(e)) from None
    grads = [bool(getattr(x, "requires_grad", False)) for x in example_inputs]
    return Exported(program, convert(program, "error", type(module).__name__, grads, rows))


def distribute_module(
    module: Any,
    plan: Plan | DTensorPlacements,
    *example_inputs: Any,
    mesh: Any = None,
    rows: bool = True,
    mode: str = "dtensor",
    exported: Exported | None = None,
    seed: int = 0,
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

    ``exported`` is :func:`export_module` of ``module`` on ``example_inputs``, made once for
    several distributions (each process of a run forked after it); by default it is made here.
    ``seed`` seeds the step's random values (dropout's masks; :mod:`taps.export.draws`).
    """
    torch = _torch()
    dtensor = require("torch.distributed.tensor", "torch", "distribute_module")

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
    if not isinstance(module, torch.nn.Module):
        raise ExportError(f"distribute_module needs a torch.nn.Module, got {type(module).__name__}")
    placements = (
        DTensorPlacements.from_layouts(layouts, dict(module.named_buffers()))
        if layouts is not None
        else plan
    )
    assert isinstance(placements, DTensorPlacements)
    if exported is None:
        exported = export_module(module, *example_inputs, rows=rows)
    program, conversion = exported.program, exported.conversion
    unlike = (
        unlike_operators(plan.graph, conversion.graph)
        if isinstance(plan, Plan)
        else unlike_names(placements.operators, (op.name for op in conversion.graph.ops))
    )
    if unlike:
        raise ExportError(f"the plan is not of this module: {unlike}")
    params = stacked_parameters(dict(module.named_parameters()), conversion.graph)
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
    return DistributedModule(
        program, conversion, placements, mesh, parameters, buffers, replay, seed
    )


def _constant(program: Any, target: str) -> Any:
    if target in program.state_dict:
        return program.state_dict[target]
    return program.constants[target]
