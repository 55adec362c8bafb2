"""The operator graph: tensors, einsum operators over named axes, views, and their JSON form.

Every operator is an einsum over named axes (SPEC section 5): each operand dim is one axis, an axis
in the inputs but not the output is contracted, and the operator says which axes may be split.
A reshape is not an operator: it makes a *view* whose edge carries the change of shape, which the
redistribution planner handles (SPEC section 2).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from taps._core import GraphError

TENSOR_KINDS = ("input", "parameter", "activation", "view")

FORMAT = "taps.graph"
VERSION = 1


@dataclass(frozen=True)
class Tensor:
    """A tensor of the graph. ``producer`` names the operator of an activation; ``base`` the tensor
    a view reshapes."""

    name: str
    shape: tuple[int, ...]
    dtype_bytes: int = 2
    kind: str = "input"
    producer: str | None = None
    base: str | None = None
    requires_grad: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Operand:
    """One input or output of an operator: the tensor and the axis of each of its dims."""

    tensor: str
    dims: tuple[str, ...]


@dataclass(frozen=True)
class Operator:
    """An einsum over named axes. Axes not in ``partitionable`` are never split."""

    name: str
    kind: str
    axes: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    partitionable: tuple[str, ...]
    inputs: tuple[Operand, ...]
    output: Operand

    def axis_size(self, axis: str) -> int:
        return self.axis_sizes[self.axes.index(axis)]

    @property
    def partitionable_sizes(self) -> tuple[int, ...]:
        return tuple(self.axis_size(a) for a in self.partitionable)

    @property
    def contracted(self) -> tuple[str, ...]:
        """Axes in the inputs and not in the output: split, they leave partial sums."""
        used = {d for operand in self.inputs for d in operand.dims}
        return tuple(a for a in self.axes if a in used and a not in self.output.dims)

    def operand_axis_indices(self, operand: Operand) -> list[int]:
        """For each dim of ``operand``, its axis's index in ``partitionable``, or -1."""
        return [
            self.partitionable.index(d) if d in self.partitionable else -1 for d in operand.dims
        ]

    @property
    def input_tensors(self) -> tuple[str, ...]:
        return tuple(o.tensor for o in self.inputs)

    @property
    def output_tensor(self) -> str:
        return self.output.tensor


@dataclass(frozen=True)
class Edge:
    """An operator input made by another operator: the activation (``tensor``) travels from
    ``producer`` to input ``slot`` of ``consumer``, reshaped on the way if it goes through views."""

    producer: str
    consumer: str
    slot: int
    tensor: str
    producer_shape: tuple[int, ...]
    consumer_shape: tuple[int, ...]


def _shape(name: str, shape: Iterable[int]) -> tuple[int, ...]:
    try:
        dims = tuple(shape)
    except TypeError:
        raise GraphError(f"tensor {name!r}: shape {shape!r} is not a sequence of ints") from None
    if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
        raise GraphError(f"tensor {name!r}: shape {list(dims)} must hold positive ints")
    return dims


_LEADING = ("b", "s", "t", "u")


def _dim_names(rank: int, last: str = "h") -> tuple[str, ...]:
    """Readable axis names for a tensor of ``rank`` dims: leading dims, then ``last``."""
    if rank == 1:
        return (last,)
    lead = (
        _LEADING[: rank - 1]
        if rank - 1 <= len(_LEADING)
        else tuple(f"d{i}" for i in range(rank - 1))
    )
    return (*lead, last)


class Graph:
    """A computation graph of einsum operators. Operators are kept in topological order: a
    tensor must exist before an operator uses it (``from_json`` sorts what it reads).

    ``layers`` says how many identical layers the graph stands for: memory is multiplied by it.
    """

    def __init__(self, name: str = "graph", layers: int = 1) -> None:
        if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
            raise GraphError(f"graph {name!r}: layers must be a positive int, got {layers!r}")
        self.name = name
        self.layers = layers
        self.tensors: dict[str, Tensor] = {}
        self._ops: dict[str, Operator] = {}

    # -- building ---------------------------------------------------------------------------

    def _new_name(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise GraphError(f"names must be non-empty strings, got {name!r}")
        if name in self.tensors or name in self._ops:
            raise GraphError(f"name {name!r} is already used in graph {self.name!r}")

    def _tensor(self, t: Tensor | str) -> Tensor:
        name = t if isinstance(t, str) else t.name
        if name not in self.tensors:
            raise GraphError(f"unknown tensor {name!r} in graph {self.name!r}")
        return self.tensors[name]

    def _add_tensor(self, t: Tensor) -> Tensor:
        self._new_name(t.name)
        self.tensors[t.name] = t
        return t

    def input(
        self, name: str, shape: Sequence[int], dtype_bytes: int = 2, requires_grad: bool = False
    ) -> Tensor:
        """A graph input (data). ``requires_grad`` for an input that stands for the output of an
        earlier layer, whose gradient must flow back."""
        return self._add_tensor(
            Tensor(name, _shape(name, shape), dtype_bytes, "input", requires_grad=requires_grad)
        )

    def parameter(self, name: str, shape: Sequence[int], dtype_bytes: int = 2) -> Tensor:
        """A trainable parameter."""
        return self._add_tensor(
            Tensor(name, _shape(name, shape), dtype_bytes, "parameter", requires_grad=True)
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
    ) -> Tensor:
        """The one path every operator takes: operands as (tensor, axis of each dim), the output
        axes, the partitionable axes (None: all). ``axis_sizes`` gives the sizes of output axes
        that no input has. Returns the output activation, named ``name + ".out"``."""
        self._new_name(name)
        out_name = f"{name}.out"
        self._new_name(out_name)
        sizes: dict[str, int] = {}
        operands = []
        for slot, (t, dims) in enumerate(inputs):
            tensor = self._tensor(t)
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
            operands.append(Operand(tensor.name, dims))
        for d, size in (axis_sizes or {}).items():
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
        axes = tuple(sizes)
        part = axes if partitionable is None else tuple(partitionable)
        unknown = [a for a in part if a not in sizes]
        if unknown:
            raise GraphError(
                f"operator {name!r}: partitionable axes {unknown} are not axes of "
                f"the operator {list(axes)}"
            )
        part = tuple(a for a in axes if a in part)
        if dtype_bytes is None:
            dtype_bytes = self._tensor(operands[0].tensor).dtype_bytes if operands else 2
        op = Operator(
            name,
            kind,
            axes,
            tuple(sizes[a] for a in axes),
            part,
            tuple(operands),
            Operand(out_name, output_dims),
        )
        self._ops[name] = op
        return self._add_tensor(
            Tensor(
                out_name,
                tuple(sizes[d] for d in output_dims),
                dtype_bytes,
                "activation",
                producer=name,
                requires_grad=True,
            )
        )

    def einsum(
        self,
        name: str,
        spec: str,
        *tensors: Tensor | str,
        partitionable: Iterable[str] | None = None,
        kind: str = "einsum",
    ) -> Tensor:
        """An operator from an einsum spec such as ``"bi,io->bo"``; each letter is an axis."""
        lhs, arrow, rhs = spec.replace(" ", "").partition("->")
        subscripts = lhs.split(",") if lhs else []
        if not arrow or not all(s.isalpha() for s in [*subscripts, rhs] if s):
            raise GraphError(f"operator {name!r}: {spec!r} is not an einsum spec like 'bi,io->bo'")
        if len(subscripts) != len(tensors):
            raise GraphError(
                f"operator {name!r}: spec {spec!r} has {len(subscripts)} operands "
                f"but {len(tensors)} tensors were given"
            )
        return self.add_operator(
            name,
            kind,
            [(t, tuple(s)) for t, s in zip(tensors, subscripts)],
            tuple(rhs),
            partitionable,
        )

    def linear(self, name: str, x: Tensor | str, out_features: int, bias: bool = False) -> Tensor:
        """``x @ W`` (+ ``b``) over the last dim of ``x``; every axis is partitionable."""
        x = self._tensor(x)
        lead = _dim_names(len(x.shape), "in")[:-1]
        w = self.parameter(f"{name}.weight", (x.shape[-1], out_features), x.dtype_bytes)
        inputs: list[tuple[Tensor | str, Sequence[str]]] = [(x, (*lead, "in")), (w, ("in", "out"))]
        if bias:
            inputs.append(
                (self.parameter(f"{name}.bias", (out_features,), x.dtype_bytes), ("out",))
            )
        return self.add_operator(name, "linear", inputs, (*lead, "out"))

    def matmul(self, name: str, a: Tensor | str, b: Tensor | str) -> Tensor:
        """``a @ b`` with matching leading (batch) dims: ``...ik,...kj->...ij``."""
        a, b = self._tensor(a), self._tensor(b)
        if len(a.shape) != len(b.shape) or len(a.shape) < 2:
            raise GraphError(
                f"operator {name!r}: matmul needs two tensors of one rank >= 2, got "
                f"{list(a.shape)} and {list(b.shape)}"
            )
        lead = _dim_names(len(a.shape) - 1, "x")[:-1] if len(a.shape) > 2 else ()
        return self.add_operator(
            name, "matmul", [(a, (*lead, "i", "k")), (b, (*lead, "k", "j"))], (*lead, "i", "j")
        )

    def batch_matmul(self, name: str, a: Tensor | str, b: Tensor | str) -> Tensor:
        """Batched ``a @ b`` (same as :meth:`matmul` with leading batch dims)."""
        return self.matmul(name, a, b)

    def conv2d(
        self,
        name: str,
        x: Tensor | str,
        out_channels: int,
        kernel: int,
        stride: int = 1,
        padding: int = 0,
        pool: tuple[int, int] | None = None,
    ) -> Tensor:
        """2-D convolution of ``x`` (b, cin, h, w) with a (cout, cin, k, k) weight. Batch, in- and
        out-channels are partitionable; spatial axes stay whole. ``pool=(kernel, stride)`` folds
        a following max-pool into the operator's output shape."""
        x = self._tensor(x)
        if len(x.shape) != 4:
            raise GraphError(
                f"operator {name!r}: conv2d needs a (b, c, h, w) input, got {list(x.shape)}"
            )
        _, cin, h, w = x.shape
        ho, wo = ((d + 2 * padding - kernel) // stride + 1 for d in (h, w))
        if pool is not None:
            ho, wo = ((d - pool[0]) // pool[1] + 1 for d in (ho, wo))
        if ho < 1 or wo < 1:
            raise GraphError(f"operator {name!r}: kernel {kernel} does not fit input {h}x{w}")
        weight = self.parameter(
            f"{name}.weight", (out_channels, cin, kernel, kernel), x.dtype_bytes
        )
        return self.add_operator(
            name,
            "conv2d",
            [(x, ("b", "ci", "hi", "wi")), (weight, ("co", "ci", "kh", "kw"))],
            ("b", "co", "ho", "wo"),
            partitionable=("b", "ci", "co"),
            axis_sizes={"ho": ho, "wo": wo},
        )

    def pool(self, name: str, x: Tensor | str, kernel: int, stride: int | None = None) -> Tensor:
        """Max or average pooling of ``x`` (b, c, h, w): batch and channels partitionable."""
        x = self._tensor(x)
        if len(x.shape) != 4:
            raise GraphError(f"operator {name!r}: pooling needs a (b, c, h, w) input")
        stride = stride or kernel
        ho, wo = ((d - kernel) // stride + 1 for d in x.shape[2:])
        if ho < 1 or wo < 1:
            raise GraphError(
                f"operator {name!r}: pooling window {kernel} does not fit {list(x.shape[2:])}"
            )
        return self.add_operator(
            name,
            "pool",
            [(x, ("b", "c", "hi", "wi"))],
            ("b", "c", "ho", "wo"),
            partitionable=("b", "c"),
            axis_sizes={"ho": ho, "wo": wo},
        )

    def _elementwise(self, name: str, kind: str, *tensors: Tensor | str) -> Tensor:
        ts = [self._tensor(t) for t in tensors]
        if any(t.shape != ts[0].shape for t in ts):
            raise GraphError(
                f"operator {name!r}: {kind} needs operands of one shape, got "
                f"{[list(t.shape) for t in ts]}"
            )
        dims = _dim_names(len(ts[0].shape))
        return self.add_operator(name, kind, [(t, dims) for t in ts], dims)

    def add(self, name: str, a: Tensor | str, b: Tensor | str) -> Tensor:
        return self._elementwise(name, "add", a, b)

    def mul(self, name: str, a: Tensor | str, b: Tensor | str) -> Tensor:
        return self._elementwise(name, "mul", a, b)

    def relu(self, name: str, x: Tensor | str) -> Tensor:
        return self._elementwise(name, "relu", x)

    def gelu(self, name: str, x: Tensor | str) -> Tensor:
        return self._elementwise(name, "gelu", x)

    def layernorm(self, name: str, x: Tensor | str) -> Tensor:
        """Layer norm over the last dim (kept whole), with gamma and beta parameters."""
        x = self._tensor(x)
        dims = _dim_names(len(x.shape))
        gamma = self.parameter(f"{name}.gamma", (x.shape[-1],), x.dtype_bytes)
        beta = self.parameter(f"{name}.beta", (x.shape[-1],), x.dtype_bytes)
        return self.add_operator(
            name,
            "layernorm",
            [(x, dims), (gamma, dims[-1:]), (beta, dims[-1:])],
            dims,
            partitionable=dims[:-1],
        )

    def softmax(self, name: str, x: Tensor | str, axis: int = -1) -> Tensor:
        """Softmax along ``axis`` (kept whole)."""
        x = self._tensor(x)
        dims = _dim_names(len(x.shape))
        if not -len(dims) <= axis < len(dims):
            raise GraphError(f"operator {name!r}: axis {axis} out of range for {list(x.shape)}")
        whole = dims[axis]
        return self.add_operator(
            name, "softmax", [(x, dims)], dims, partitionable=[d for d in dims if d != whole]
        )

    def embedding(
        self, name: str, ids: Tensor | str, vocab: int, hidden: int, dtype_bytes: int = 2
    ) -> Tensor:
        """Token embedding: ids (b, s) x table (v, h) -> (b, s, h). Modelled as a one-hot matmul,
        so a split vocabulary leaves partial sums."""
        ids = self._tensor(ids)
        lead = _dim_names(len(ids.shape) + 1)[:-1]
        table = self.parameter(f"{name}.table", (vocab, hidden), dtype_bytes)
        return self.add_operator(
            name,
            "embedding",
            [(ids, lead), (table, ("v", "h"))],
            (*lead, "h"),
            dtype_bytes=dtype_bytes,
        )

    def reshape(self, name: str, x: Tensor | str, shape: Sequence[int]) -> Tensor:
        """A view of ``x`` with another shape of the same element count. No operator: the edge
        to the consumer changes the shape."""
        x = self._tensor(x)
        shape = _shape(name, shape)
        if math.prod(shape) != x.numel:
            raise GraphError(
                f"view {name!r}: shape {list(shape)} holds {math.prod(shape)} "
                f"elements but {x.name!r} {list(x.shape)} holds {x.numel}"
            )
        return self._add_tensor(
            Tensor(name, shape, x.dtype_bytes, "view", base=x.name, requires_grad=x.requires_grad)
        )

    view = reshape

    # -- reading ----------------------------------------------------------------------------

    @property
    def ops(self) -> list[Operator]:
        """The operators in topological order."""
        return list(self._ops.values())

    def op(self, name: str) -> Operator:
        if name not in self._ops:
            raise GraphError(f"unknown operator {name!r} in graph {self.name!r}")
        return self._ops[name]

    def root(self, tensor: str) -> Tensor:
        """The tensor behind a chain of views."""
        t = self.tensors[tensor]
        while t.kind == "view":
            assert t.base is not None
            t = self.tensors[t.base]
        return t

    @property
    def edges(self) -> list[Edge]:
        """Every operator input made by another operator, in topological order of consumers."""
        out = []
        for op in self._ops.values():
            for slot, operand in enumerate(op.inputs):
                root = self.root(operand.tensor)
                if root.kind == "activation":
                    assert root.producer is not None
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
        return sum(t.numel for t in self.tensors.values() if t.kind == "parameter")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        # The order of operators is part of the graph; that of tensors is not.
        return (self.name, self.layers, self.tensors, list(self._ops.items())) == (
            other.name,
            other.layers,
            other.tensors,
            list(other._ops.items()),
        )

    def __repr__(self) -> str:
        return (
            f"Graph({self.name!r}, layers={self.layers}, {len(self._ops)} operators, "
            f"{len(self.tensors)} tensors)"
        )

    # -- JSON -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        tensors = []
        for t in self.tensors.values():
            if t.kind == "activation":
                continue  # made by its operator
            entry: dict[str, Any] = {
                "name": t.name,
                "kind": t.kind,
                "shape": list(t.shape),
                "dtype_bytes": t.dtype_bytes,
            }
            if t.kind == "input":
                entry["requires_grad"] = t.requires_grad
            if t.base is not None:
                entry["base"] = t.base
            tensors.append(entry)
        ops = []
        for op in self._ops.values():
            ops.append(
                {
                    "name": op.name,
                    "kind": op.kind,
                    "axes": [[a, s] for a, s in zip(op.axes, op.axis_sizes)],
                    "partitionable": list(op.partitionable),
                    "inputs": [{"tensor": o.tensor, "dims": list(o.dims)} for o in op.inputs],
                    "output": {
                        "dims": list(op.output.dims),
                        "dtype_bytes": self.tensors[op.output.tensor].dtype_bytes,
                    },
                }
            )
        return {
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "layers": self.layers,
            "tensors": tensors,
            "ops": ops,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Graph:
        """Read a graph written by :meth:`to_json` (schema in docs/graph.md). Errors name the
        field, e.g. ``ops[3].inputs[1].tensor: unknown tensor 'h9'``."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise GraphError(f"not JSON: {e}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> Graph:
        r = _Reader()
        r.obj(data, "")
        fmt, version = r.get(data, "", "format", str), r.get(data, "", "version", int)
        if fmt != FORMAT:
            raise GraphError(f"format: expected {FORMAT!r}, got {fmt!r}")
        if version != VERSION:
            raise GraphError(f"version: this taps reads version {VERSION}, got {version}")
        g = cls(r.get(data, "", "name", str), r.get(data, "", "layers", int))
        pending: list[_Pending] = []
        for i, t in enumerate(r.get(data, "", "tensors", list)):
            path = f"tensors[{i}]"
            r.obj(t, path)
            name, kind = r.get(t, path, "name", str), r.get(t, path, "kind", str)
            shape = r.ints(r.get(t, path, "shape", list), f"{path}.shape")
            dtype = r.get(t, path, "dtype_bytes", int)
            with r.at(path):
                if kind == "input":
                    g.input(name, shape, dtype, r.get(t, path, "requires_grad", bool))
                elif kind == "parameter":
                    g.parameter(name, shape, dtype)
                elif kind == "view":
                    base = r.get(t, path, "base", str)
                    pending.append(
                        _Pending(
                            path,
                            name,
                            (("base", base),),
                            name,
                            lambda g, n=name, b=base, s=shape: g.reshape(n, b, s),
                        )
                    )
                else:
                    raise GraphError(f"kind: expected 'input', 'parameter' or 'view', got {kind!r}")
        for i, op in enumerate(r.get(data, "", "ops", list)):
            pending.append(_read_op(r, op, f"ops[{i}]"))
        g._add_in_order(pending)
        return g

    def _add_in_order(self, pending: list[_Pending]) -> None:
        """Add views and operators once what they use exists (in file order where possible);
        whatever is left waits on a tensor nobody makes, or on a cycle."""
        progress = True
        while pending and progress:
            progress = False
            for p in list(pending):
                if all(t in self.tensors for _, t in p.uses):
                    with _Reader().at(p.path):
                        p.add(self)
                    pending.remove(p)
                    progress = True
        made = {p.makes for p in pending}
        for p in pending:
            for field, t in p.uses:
                if t not in self.tensors and t not in made:
                    raise GraphError(f"{p.path}.{field}: unknown tensor {t!r}")
        if pending:
            raise GraphError(f"the graph has a cycle through {[p.name for p in pending]}")


@dataclass(frozen=True)
class _Pending:
    """A view or operator read from JSON, added once the tensors it uses exist."""

    path: str
    name: str
    uses: tuple[tuple[str, str], ...]  # (field, tensor name)
    makes: str
    add: Any  # Callable[[Graph], None]


def _read_op(r: _Reader, op: Any, path: str) -> _Pending:
    r.obj(op, path)
    name, kind = r.get(op, path, "name", str), r.get(op, path, "kind", str)
    sizes: dict[str, int] = {}
    for j, pair in enumerate(r.get(op, path, "axes", list)):
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not isinstance(pair[0], str)
            or not isinstance(pair[1], int)
            or isinstance(pair[1], bool)
        ):
            raise GraphError(f"{path}.axes[{j}]: expected [name, size], got {pair!r}")
        sizes[pair[0]] = pair[1]
    part = r.strs(r.get(op, path, "partitionable", list), f"{path}.partitionable")
    inputs = []
    for j, operand in enumerate(r.get(op, path, "inputs", list)):
        p = f"{path}.inputs[{j}]"
        r.obj(operand, p)
        inputs.append(
            (r.get(operand, p, "tensor", str), r.strs(r.get(operand, p, "dims", list), f"{p}.dims"))
        )
    out = r.get(op, path, "output", dict)
    out_dims = r.strs(r.get(out, f"{path}.output", "dims", list), f"{path}.output.dims")
    dtype = r.get(out, f"{path}.output", "dtype_bytes", int)

    def add(g: Graph) -> None:
        missing = sorted(
            {d for _, dims in inputs for d in dims} - set(sizes) | set(out_dims) - set(sizes)
        )
        if missing:
            raise GraphError(f"axes: no size for axes {missing}")
        g.add_operator(name, kind, inputs, out_dims, part, {d: sizes[d] for d in out_dims}, dtype)
        got = dict(zip(g.op(name).axes, g.op(name).axis_sizes))
        if got != sizes:
            raise GraphError(f"axes: {sizes} disagree with the operand shapes ({got})")

    uses = tuple((f"inputs[{j}].tensor", t) for j, (t, _) in enumerate(inputs))
    return _Pending(path, name, uses, f"{name}.out", add)


class _Reader:
    """Typed access to JSON fields with errors that name the field path."""

    def obj(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise GraphError(
                f"{path or 'top level'}: expected an object, got {type(value).__name__}"
            )

    def get(self, obj: dict, path: str, key: str, typ: type) -> Any:
        where = f"{path}.{key}" if path else key
        if key not in obj:
            raise GraphError(f"{where}: missing")
        value = obj[key]
        if (typ is int and isinstance(value, bool)) or not isinstance(value, typ):
            raise GraphError(f"{where}: expected {typ.__name__}, got {value!r}")
        return value

    def ints(self, values: list, path: str) -> list[int]:
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise GraphError(f"{path}: expected a list of ints, got {values!r}")
        return values

    def strs(self, values: list, path: str) -> list[str]:
        if not all(isinstance(v, str) for v in values):
            raise GraphError(f"{path}: expected a list of strings, got {values!r}")
        return values

    class _At:
        def __init__(self, path: str) -> None:
            self.path = path

        def __enter__(self) -> None:
            return None

        def __exit__(self, typ: Any, exc: Any, tb: Any) -> None:
            if isinstance(exc, GraphError) and not str(exc).startswith(self.path):
                raise GraphError(f"{self.path}: {exc}") from None

    def at(self, path: str) -> _Reader._At:
        """Prefix errors raised inside with the field path."""
        return _Reader._At(path)
