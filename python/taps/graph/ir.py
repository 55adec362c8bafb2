"""The graph IR: :class:`GraphIR` holds tensors and operators in topological order, with the one
validating way in (:meth:`Graph.add_operator`), views, tied repeats and the queries the search
reads. The builders (:mod:`taps.graph.builders`) and the JSON form (:mod:`taps.graph.serialize`)
use only what is public here."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from taps._core import GraphError
from taps.graph.records import (
    MOE_DISPATCH,
    SAVED,
    SHARE,
    Edge,
    Operand,
    Operator,
    Tensor,
    checked_dtype,
    checked_shape,
    is_positive_int,
)


class GraphIR:
    """A computation graph of einsum operators. Operators are kept in topological order: a
    tensor must exist before an operator uses it (``from_json`` sorts what it reads).

    ``layers`` says how many identical layers the graph stands for: memory is multiplied by it.
    """

    def __init__(self, name: str = "graph", layers: int = 1) -> None:
        if not isinstance(name, str):
            raise GraphError(f"graph name must be a string, got {name!r}")
        if not is_positive_int(layers):
            raise GraphError(f"graph {name!r}: layers must be a positive int, got {layers!r}")
        self.name = name
        self.layers = layers
        self.tensors: dict[str, Tensor] = {}
        self._ops: dict[str, Operator] = {}
        self._tied: list[tuple[tuple[str, ...], ...]] = []
        self._stacks: dict[str, tuple[tuple[str, ...], int]] = {}

    # -- building ---------------------------------------------------------------------------

    def _new_name(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise GraphError(f"names must be non-empty strings, got {name!r}")
        if name in self.tensors or name in self._ops or name in self._stacks:
            raise GraphError(f"name {name!r} is already used in graph {self.name!r}")

    def tensor(self, t: Tensor | str) -> Tensor:
        """The graph's tensor of that name (or that tensor's name); :class:`GraphError` if none."""
        name = t if isinstance(t, str) else t.name
        if name not in self.tensors:
            raise GraphError(f"unknown tensor {name!r} in graph {self.name!r}")
        return self.tensors[name]

    def _add_tensor(self, t: Tensor) -> Tensor:
        self._new_name(t.name)
        checked_dtype(f"tensor {t.name!r}", t.dtype_bytes)
        self.tensors[t.name] = t
        return t

    def input(
        self, name: str, shape: Sequence[int], dtype_bytes: int = 2, requires_grad: bool = False
    ) -> Tensor:
        """A graph input (data). ``requires_grad`` for an input that stands for the output of an
        earlier layer, whose gradient must flow back."""
        if not isinstance(requires_grad, bool):
            raise GraphError(
                f"tensor {name!r}: requires_grad must be a bool, got {requires_grad!r}"
            )
        return self._add_tensor(
            Tensor(
                name, checked_shape(name, shape), dtype_bytes, "input", requires_grad=requires_grad
            )
        )

    def parameter(
        self, name: str, shape: Sequence[int], dtype_bytes: int = 2, requires_grad: bool = True
    ) -> Tensor:
        """A parameter; ``requires_grad=False`` for a frozen one (a fine-tune's base weights, a
        fixed position table): stored as any parameter, with no gradient, no gradient reduction
        and no optimizer state."""
        if not isinstance(requires_grad, bool):
            raise GraphError(
                f"tensor {name!r}: requires_grad must be a bool, got {requires_grad!r}"
            )
        return self._add_tensor(
            Tensor(
                name,
                checked_shape(name, shape),
                dtype_bytes,
                "parameter",
                requires_grad=requires_grad,
            )
        )

    def add_operator(
        self,
        name: str,
        kind: str,
        inputs: Sequence[tuple[Tensor | str, Sequence[str]]],
        output_dims: Sequence[str],
        partitionable: Iterable[str] | None = None,
        axis_sizes: dict[str, int] | None = None,
        dtype_bytes: int | None = None,
        axis_order: Sequence[str] | None = None,
        addends: Sequence[tuple[Tensor | str, Sequence[str]]] = (),
        saved: str = "output",
    ) -> Tensor:
        """The one path every operator takes.

        ``inputs`` are (tensor, axis of each of its dims) pairs, ``output_dims`` the output's axes,
        ``addends`` more such pairs, the inputs added to the result after the contraction (a
        linear's bias, :attr:`Operand.addend`), in slots after ``inputs`` and over output axes,
        ``partitionable`` the axes that may be split (None: all). ``axis_sizes`` gives the sizes of
        output axes that no input has (it may repeat others, which must agree). ``dtype_bytes``
        defaults to that of the first input. ``axis_order`` lists every axis in the order the
        operator keeps them (default: first appearance in the inputs, then output-only axes).
        ``saved`` is what the backward keeps of the output (:attr:`Operator.saved`). Returns the
        output activation, named ``name + ".out"``.
        """
        self._new_name(name)
        out_name = f"{name}.out"
        self._new_name(out_name)
        if not isinstance(kind, str) or not kind:
            raise GraphError(f"operator {name!r}: kind must be a non-empty string, got {kind!r}")
        if saved not in SAVED:
            raise GraphError(
                f"operator {name!r}: saved must be one of {', '.join(SAVED)}, got {saved!r}"
            )
        if not inputs:
            raise GraphError(f"operator {name!r}: needs at least one input")
        sizes: dict[str, int] = {}
        operands = []
        n_factors = len(inputs)
        for slot, (t, dims) in enumerate([*inputs, *addends]):
            tensor = self.tensor(t)
            dims = tuple(dims)
            if len(dims) != len(tensor.shape):
                raise GraphError(
                    f"operator {name!r}: input {slot} ({tensor.name!r}, shape {list(tensor.shape)})"
                    f" has {len(tensor.shape)} dims but the operator gives it {len(dims)} axes "
                    f"{list(dims)}"
                )
            if len(set(dims)) != len(dims):
                raise GraphError(f"operator {name!r}: input {slot} repeats an axis in {list(dims)}")
            for d, size in zip(dims, tensor.shape):
                if sizes.setdefault(d, size) != size:
                    raise GraphError(
                        f"operator {name!r}: axis {d!r} has size {sizes[d]} in one operand and "
                        f"{size} in input {slot} ({tensor.name!r})"
                    )
            operands.append(Operand(tensor.name, dims, addend=slot >= n_factors))
        for d, size in (axis_sizes or {}).items():
            if not is_positive_int(size):
                raise GraphError(f"operator {name!r}: axis {d!r} needs a positive size, got {size}")
            if sizes.setdefault(d, size) != size:
                raise GraphError(
                    f"operator {name!r}: axis {d!r} given size {size} but has {sizes[d]}"
                )
        output_dims = tuple(output_dims)
        if len(set(output_dims)) != len(output_dims):
            raise GraphError(f"operator {name!r}: output repeats an axis in {list(output_dims)}")
        missing = [d for d in output_dims if d not in sizes]
        if missing:
            raise GraphError(f"operator {name!r}: output axes {missing} appear in no input")
        for slot, o in enumerate(operands[n_factors:], n_factors):
            if not set(o.dims) <= set(output_dims):
                raise GraphError(
                    f"operator {name!r}: addend {slot} ({o.tensor!r}) has axes "
                    f"{[d for d in o.dims if d not in output_dims]} that are not output axes"
                )
        used = {d for o in operands for d in o.dims} | set(output_dims)
        unused = [d for d in sizes if d not in used]
        if unused:
            raise GraphError(f"operator {name!r}: axes {unused} belong to no operand")
        axes = tuple(sizes)
        if axis_order is not None:
            if sorted(axis_order) != sorted(axes):
                raise GraphError(
                    f"operator {name!r}: axis_order {list(axis_order)} is not an order of the "
                    f"axes {list(axes)}"
                )
            axes = tuple(axis_order)
        part = axes if partitionable is None else tuple(partitionable)
        unknown = [a for a in part if a not in sizes]
        if unknown:
            raise GraphError(
                f"operator {name!r}: partitionable axes {unknown} are not axes of "
                f"the operator {list(axes)}"
            )
        part = tuple(a for a in axes if a in part)
        if dtype_bytes is None:
            dtype_bytes = self.tensors[operands[0].tensor].dtype_bytes
        dtype_bytes = checked_dtype(f"operator {name!r}", dtype_bytes)
        op = Operator(
            name,
            kind,
            axes,
            tuple(sizes[a] for a in axes),
            part,
            tuple(operands),
            Operand(out_name, output_dims),
            saved,
        )
        self._ops[name] = op
        return self._add_tensor(
            Tensor(
                out_name,
                tuple(sizes[d] for d in output_dims),
                dtype_bytes,
                "activation",
                producer=name,
                requires_grad=any(self.tensors[o.tensor].requires_grad for o in operands),
            )
        )

    def reshape(self, name: str, x: Tensor | str, shape: Sequence[int]) -> Tensor:
        """A view of ``x`` with another shape of the same element count. No operator: the edge
        to the consumer changes the shape."""
        x = self.tensor(x)
        shape = checked_shape(name, shape)
        if math.prod(shape) != x.numel:
            raise GraphError(
                f"view {name!r}: shape {list(shape)} holds {math.prod(shape)} "
                f"elements but {x.name!r} {list(x.shape)} holds {x.numel}"
            )
        return self._add_tensor(
            Tensor(name, shape, x.dtype_bytes, "view", base=x.name, requires_grad=x.requires_grad)
        )

    view = reshape

    def share_parameters(self) -> list[str]:
        """Make every parameter read more than once (a weight tied to two layers, a module
        called twice) one parameter read once: a ``share`` operator (kind :data:`SHARE`, named
        ``param + ".share"``) reads it and every use reads the operator's output, directly or
        through the same views as before. The parameter is then held, counted in memory and its
        gradient reduced once, at that operator; each use's gradient comes back to it on its
        edge (redistributed from the use's layout and summed there), and each use gets the weight
        in its layout on the same edge forward. Returns the new operators' names, in order; call
        it before :meth:`tie`."""
        if self._tied:
            raise GraphError("share_parameters: call it before declaring ties")
        uses: dict[str, list[tuple[str, int]]] = {}
        for op in self._ops.values():
            for slot, o in enumerate(op.inputs):
                root = self.root(o.tensor)
                if root.kind == "parameter":
                    uses.setdefault(root.name, []).append((op.name, slot))
        shared = [p for p, u in uses.items() if len(u) > 1]
        if not shared:
            return []
        for p in shared:  # checked before anything changes
            self._new_name(f"{p}.share")
            self._new_name(f"{p}.share.out")
        made = []
        before: dict[str, list[str]] = {}  # first reader -> the share operators to put before it
        for p in shared:
            t = self.tensors[p]
            axes = [f"p{i}" for i in range(len(t.shape))]
            out = self.add_operator(f"{p}.share", SHARE, [(p, axes)], axes).name
            made.append(f"{p}.share")
            before.setdefault(uses[p][0][0], []).append(f"{p}.share")
            for name, v in list(self.tensors.items()):
                if v.kind == "view" and v.base == p:
                    self.tensors[name] = dataclasses.replace(v, base=out)
            for op_name, slot in uses[p]:
                op = self._ops[op_name]
                if op.inputs[slot].tensor == p:
                    inputs = list(op.inputs)
                    inputs[slot] = dataclasses.replace(inputs[slot], tensor=out)
                    self._ops[op_name] = dataclasses.replace(op, inputs=tuple(inputs))
        order = [name for name in self._ops if name not in made]
        ops = dict(self._ops)
        self._ops = {}
        for name in order:
            for s in before.get(name, ()):
                self._ops[s] = ops[s]
            self._ops[name] = ops[name]
        return made

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """Undo every tensor and operator added inside the block if it raises
        :class:`GraphError`, so a builder that fails half-way leaves the graph as it was."""
        tensors, ops, tied = len(self.tensors), len(self._ops), len(self._tied)
        stacks = len(self._stacks)
        try:
            yield
        except GraphError:
            for name in list(self._stacks)[stacks:]:
                del self._stacks[name]
            for name in list(self.tensors)[tensors:]:
                del self.tensors[name]
            for name in list(self._ops)[ops:]:
                del self._ops[name]
            del self._tied[tied:]
            raise

    def tie(self, instances: Sequence[Sequence[str]]) -> None:
        """Declare the operator lists ``instances`` repeats of one block (a model's identical
        layers): operator ``i`` of every instance has the same kind and :meth:`signature`.
        A search may then give every instance the same strategies. An operator belongs to at most
        one tie."""
        groups = [tuple(inst) for inst in instances]
        if len(groups) < 2:
            raise GraphError(f"tie: needs at least two instances, got {len(groups)}")
        if not groups[0] or any(len(g) != len(groups[0]) for g in groups):
            raise GraphError(
                f"tie: instances must be non-empty and of one length, got lengths "
                f"{[len(g) for g in groups]}"
            )
        taken = {name for group in self._tied for inst in group for name in inst}
        for inst in groups:
            for name in inst:
                self.op(name)
                if name in taken:
                    raise GraphError(f"tie: operator {name!r} is in two instances or ties")
                taken.add(name)
        for position, first in enumerate(groups[0]):
            want = (self._ops[first].kind, self.signature(first))
            for inst in groups[1:]:
                other = inst[position]
                if (self._ops[other].kind, self.signature(other)) != want:
                    raise GraphError(
                        f"tie: operator {other!r} differs from {first!r} (position "
                        f"{position}): kind, axes, sizes or operand tensors do not match"
                    )
        self._tied.append(tuple(groups))

    def stack(self, name: str, pieces: Sequence[str], axis: int = 0) -> None:
        """Declare ``name`` the framework's array (a JAX pytree leaf) whose slices along ``axis``
        are the parameters or inputs ``pieces`` (or stacks declared before), in index order: a
        ``scan`` over stacked layers reads each layer's slice as a tensor of its own, and the
        exports place the stack as its first slice is placed, whole along ``axis``. A name, not a
        tensor: nothing reads it."""
        if not isinstance(name, str) or not name or name in self._stacks:
            raise GraphError(f"stack: {name!r} is empty or already a stack")
        self._new_name(name)
        pieces = tuple(pieces)
        if not pieces:
            raise GraphError(f"stack {name!r}: needs at least one piece")
        shapes = set()
        for piece in pieces:
            if piece in self._stacks:
                shapes.add(self.stack_shape(piece))
            elif self.tensor(piece).kind in ("parameter", "input"):
                shapes.add(self.tensors[piece].shape)
            else:
                raise GraphError(f"stack {name!r}: {piece!r} is no parameter, input or stack")
        if len(shapes) != 1:
            raise GraphError(f"stack {name!r}: its pieces have shapes {sorted(shapes)}")
        (shape,) = shapes
        if not isinstance(axis, int) or not 0 <= axis <= len(shape):
            raise GraphError(f"stack {name!r}: axis {axis!r} is not in 0..{len(shape)}")
        self._stacks[name] = (pieces, axis)

    @property
    def stacks(self) -> dict[str, tuple[tuple[str, ...], int]]:
        """The stacks declared with :meth:`stack`: name -> (pieces, axis)."""
        return dict(self._stacks)

    def stack_shape(self, name: str) -> tuple[int, ...]:
        """The shape of a stack: its pieces' with their count inserted at its axis."""
        pieces, axis = self._stacks[name]
        first = pieces[0]
        shape = list(
            self.stack_shape(first) if first in self._stacks else self.tensors[first].shape
        )
        shape.insert(axis, len(pieces))
        return tuple(shape)

    def signature(self, op_name: str) -> tuple[Any, ...]:
        """Everything about an operator but its name and kind: its axes with their sizes, its
        partitionable axes, and per operand its dims, whether it is a parameter, whether it needs
        a gradient, its element size, and per input whether it is an addend; and what its backward
        keeps of its output (:attr:`Operator.saved`). Operators of one
        signature have the same candidates, costs and memory (the search shares their tables)."""
        op = self.op(op_name)

        def operand(o: Operand, grad: bool) -> tuple[Any, ...]:
            t = self.tensors[o.tensor]
            return (o.dims, self.root(t.name).kind == "parameter", grad, t.dtype_bytes)

        return (
            op.axes,
            op.axis_sizes,
            op.partitionable,
            tuple(
                (*operand(o, self.takes_gradient(op, i)), o.addend) for i, o in enumerate(op.inputs)
            ),
            operand(op.output, self.tensors[op.output.tensor].requires_grad),
            op.saved,
        )

    @property
    def tied(self) -> tuple[tuple[tuple[str, ...], ...], ...]:
        """The ties declared with :meth:`tie`: per tie, its instances, each a tuple of operator
        names aligned by position."""
        return tuple(self._tied)

    # -- reading ----------------------------------------------------------------------------

    @property
    def ops(self) -> list[Operator]:
        """The operators in topological order."""
        return list(self._ops.values())

    def op(self, name: str) -> Operator:
        if name not in self._ops:
            raise GraphError(f"unknown operator {name!r} in graph {self.name!r}")
        return self._ops[name]

    def takes_gradient(self, op: Operator, slot: int) -> bool:
        """Whether the training step takes the gradient of ``op``'s input ``slot``: when its
        tensor requires one, but for a mixture-of-experts dispatch's routing tensor (a gather of
        the tokens where it is not zero, as an index dispatch: the router learns through the
        combine's weights, docs/moe.md)."""
        if op.kind == MOE_DISPATCH and slot == 0:
            return False
        return self.tensors[op.inputs[slot].tensor].requires_grad

    def root(self, tensor: str) -> Tensor:
        """The tensor behind a chain of views (the tensor itself if it is not a view)."""
        t = self.tensor(tensor)
        while t.base is not None:
            t = self.tensors[t.base]
        return t

    @property
    def edges(self) -> list[Edge]:
        """Every operator input made by another operator, in topological order of consumers."""
        out = []
        for op in self._ops.values():
            for slot, operand in enumerate(op.inputs):
                root = self.root(operand.tensor)
                if root.producer is not None:
                    out.append(
                        Edge(
                            root.producer,
                            op.name,
                            slot,
                            root.name,
                            root.shape,
                            self.tensors[operand.tensor].shape,
                        )
                    )
        return out

    def num_parameters(self) -> int:
        """Parameter elements of one layer (the model has ``layers`` times as many)."""
        return sum(t.numel for t in self.tensors.values() if t.kind == "parameter")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GraphIR):
            return NotImplemented
        # The order of operators is part of the graph; that of tensors is not.
        return (
            self.name,
            self.layers,
            self.tensors,
            list(self._ops.items()),
            self._tied,
            self._stacks,
        ) == (
            other.name,
            other.layers,
            other.tensors,
            list(other._ops.items()),
            other._tied,
            other._stacks,
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, layers={self.layers}, "
            f"{len(self._ops)} operators, {len(self.tensors)} tensors)"
        )
