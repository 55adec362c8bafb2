"""The operator graph: tensors, einsum operators over named axes, views, and their JSON form.

Every operator is an einsum over named axes (SPEC section 5): each operand dim is one axis, an axis
in the inputs but not the output is contracted, and the operator says which axes may be split.
A reshape is not an operator: it makes a *view* whose edge carries the change of shape, which the
redistribution planner handles (SPEC section 2).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from taps._core import GraphError
from taps.checks import MAX_INT

TENSOR_KINDS = ("input", "parameter", "activation", "view")

FORMAT = "taps.graph"
VERSION = 1


@dataclass(frozen=True)
class Tensor:
    """A tensor of the graph.

    Attributes:
        name: unique among the graph's tensors and operators.
        shape: the dims, each a positive int.
        dtype_bytes: bytes per element.
        kind: ``"input"`` (data, or an earlier layer's output), ``"parameter"`` (trainable),
            ``"activation"`` (the output of an operator) or ``"view"`` (a reshape of ``base``).
        producer: the operator that makes an activation; ``None`` for other kinds.
        base: the tensor a view reshapes (maybe itself a view); ``None`` for other kinds.
        requires_grad: whether a gradient flows back into it: always for parameters, by choice for
            inputs, for an activation when some input of its operator requires one, for a view
            when its base does.
    """

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
    """One input or output of an operator.

    Attributes:
        tensor: the tensor's name.
        dims: the operator axis of each dim of the tensor, in the tensor's dim order.
    """

    tensor: str
    dims: tuple[str, ...]


@dataclass(frozen=True)
class Operator:
    """An einsum over named axes.

    Attributes:
        name: unique among the graph's tensors and operators.
        kind: what it computes (``"einsum"``, ``"linear"``, ``"conv2d"``, ``"relu"``, ...); the
            search only reads the axes, so the kind is a label for reports.
        axes: every axis, in a fixed order (first appearance in the inputs, then output-only axes
            such as a convolution's output height).
        axis_sizes: the size of each axis, in ``axes`` order.
        partitionable: the axes a strategy may split, in ``axes`` order; the others stay whole.
        inputs: the input operands, in slot order.
        output: the output operand; its tensor is the activation named ``name + ".out"``.
    """

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
        """The sizes of the partitionable axes: what strategies are enumerated over."""
        return tuple(self.axis_size(a) for a in self.partitionable)

    @property
    def contracted(self) -> tuple[str, ...]:
        """Axes in the inputs and not in the output: split, they leave partial sums."""
        used = {d for operand in self.inputs for d in operand.dims}
        return tuple(a for a in self.axes if a in used and a not in self.output.dims)

    def operand_axis_indices(self, operand: Operand) -> list[int]:
        """For each dim of ``operand``, its axis's index in ``partitionable``, or -1 (whole).

        A strategy over the partitionable axes gives the tensor the map
        ``[strategy.device_map[i] if i >= 0 else -1 for i in indices]``.
        """
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
    """An operator input made by another operator.

    Attributes:
        producer: the operator that makes the activation.
        consumer: the operator that reads it.
        slot: the index of the input in ``consumer.inputs``.
        tensor: the producer's output activation (the root of the views the consumer reads).
        producer_shape: that activation's shape.
        consumer_shape: the shape the consumer reads: different when the edge goes through views.
    """

    producer: str
    consumer: str
    slot: int
    tensor: str
    producer_shape: tuple[int, ...]
    consumer_shape: tuple[int, ...]


def _positive_int(value: Any) -> bool:
    """A positive int that fits the core's 64-bit integers."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_INT


def _shape(name: str, shape: Iterable[int]) -> tuple[int, ...]:
    try:
        dims = tuple(shape)
    except TypeError:
        raise GraphError(f"tensor {name!r}: shape {shape!r} is not a sequence of ints") from None
    if not all(_positive_int(d) for d in dims) or math.prod(dims) > MAX_INT:
        raise GraphError(
            f"tensor {name!r}: shape {list(dims)} must hold positive ints whose product is "
            "below 2**63"
        )
    return dims


def _dtype(where: str, dtype_bytes: Any) -> int:
    if not _positive_int(dtype_bytes):
        raise GraphError(f"{where}: dtype_bytes must be a positive int, got {dtype_bytes!r}")
    return int(dtype_bytes)


def _pair(name: str, field: str, value: int | Sequence[int], least: int) -> tuple[int, int]:
    """A convolution or pooling size given as an int or an (h, w) pair."""
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= least for v in pair
    ):
        raise GraphError(
            f"operator {name!r}: {field} must be an int >= {least} or a pair of them, got {value!r}"
        )
    return int(pair[0]), int(pair[1])


def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """The output length of a convolution or pooling window: ``(size + 2p - k) // s + 1``."""
    return (size + 2 * padding - kernel) // stride + 1


_LEADING = ("b", "s", "t", "u")


def _leading(n: int) -> tuple[str, ...]:
    """Readable names for ``n`` leading (batch-like) dims."""
    return _LEADING[:n] if n <= len(_LEADING) else tuple(f"d{i}" for i in range(n))


def _dim_names(rank: int, last: str = "h") -> tuple[str, ...]:
    """Axis names for a tensor of ``rank`` dims: leading dims, then ``last``."""
    return (*_leading(rank - 1), last) if rank else ()


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _atomic(
    method: Callable[Concatenate[Graph, _P], _R],
) -> Callable[Concatenate[Graph, _P], _R]:
    """A helper that makes parameters before its operator leaves nothing behind if it fails."""

    @functools.wraps(method)
    def wrapper(self: Graph, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        tensors, ops = len(self.tensors), len(self._ops)
        try:
            return method(self, *args, **kwargs)
        except GraphError:
            for name in list(self.tensors)[tensors:]:
                del self.tensors[name]
            for name in list(self._ops)[ops:]:
                del self._ops[name]
            raise

    return wrapper


class Graph:
    """A computation graph of einsum operators. Operators are kept in topological order: a
    tensor must exist before an operator uses it (``from_json`` sorts what it reads).

    ``layers`` says how many identical layers the graph stands for: memory is multiplied by it.
    """

    def __init__(self, name: str = "graph", layers: int = 1) -> None:
        if not isinstance(name, str):
            raise GraphError(f"graph name must be a string, got {name!r}")
        if not _positive_int(layers):
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
        _dtype(f"tensor {t.name!r}", t.dtype_bytes)
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
        """The one path every operator takes.

        ``inputs`` are (tensor, axis of each of its dims) pairs, ``output_dims`` the output's axes,
        ``partitionable`` the axes that may be split (None: all). ``axis_sizes`` gives the sizes of
        output axes that no input has (it may repeat others, which must agree). ``dtype_bytes``
        defaults to that of the first input. Returns the output activation, named
        ``name + ".out"``.
        """
        self._new_name(name)
        out_name = f"{name}.out"
        self._new_name(out_name)
        if not isinstance(kind, str) or not kind:
            raise GraphError(f"operator {name!r}: kind must be a non-empty string, got {kind!r}")
        if not inputs:
            raise GraphError(f"operator {name!r}: needs at least one input")
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
            if not _positive_int(size):
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
        used = {d for o in operands for d in o.dims} | set(output_dims)
        unused = [d for d in sizes if d not in used]
        if unused:
            raise GraphError(f"operator {name!r}: axes {unused} belong to no operand")
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
            dtype_bytes = self.tensors[operands[0].tensor].dtype_bytes
        dtype_bytes = _dtype(f"operator {name!r}", dtype_bytes)
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
                requires_grad=any(self.tensors[o.tensor].requires_grad for o in operands),
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
        """An operator from an explicit einsum spec such as ``"bi,io->bo"``; each letter is an
        axis, and every output letter must appear in an input."""
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

    @_atomic
    def linear(self, name: str, x: Tensor | str, out_features: int, bias: bool = False) -> Tensor:
        """``x @ W`` (+ ``b``) over the last dim of ``x``, with the parameters ``name + ".weight"``
        of shape (in, out) and ``name + ".bias"`` of shape (out,). Every axis is partitionable."""
        x = self._tensor(x)
        if not x.shape:
            raise GraphError(f"operator {name!r}: linear needs an input of rank >= 1")
        lead = _leading(len(x.shape) - 1)
        w = self.parameter(f"{name}.weight", (x.shape[-1], out_features), x.dtype_bytes)
        inputs: list[tuple[Tensor | str, Sequence[str]]] = [(x, (*lead, "in")), (w, ("in", "out"))]
        if bias:
            inputs.append(
                (self.parameter(f"{name}.bias", (out_features,), x.dtype_bytes), ("out",))
            )
        return self.add_operator(name, "linear", inputs, (*lead, "out"))

    def matmul(self, name: str, a: Tensor | str, b: Tensor | str) -> Tensor:
        """``a @ b`` over axes ``(..., i, k, j)``: ``...ik,...kj->...ij`` when both carry the same
        leading (batch) dims, or ``...ik,kj->...ij`` when ``b`` is a matrix."""
        a, b = self._tensor(a), self._tensor(b)
        if len(a.shape) < 2 or len(b.shape) not in (2, len(a.shape)):
            raise GraphError(
                f"operator {name!r}: matmul needs a of rank >= 2 and b a matrix or of a's rank, "
                f"got {list(a.shape)} and {list(b.shape)}"
            )
        lead = _leading(len(a.shape) - 2)
        b_dims = (*lead, "k", "j") if len(b.shape) == len(a.shape) else ("k", "j")
        return self.add_operator(
            name, "matmul", [(a, (*lead, "i", "k")), (b, b_dims)], (*lead, "i", "j")
        )

    def batch_matmul(self, name: str, a: Tensor | str, b: Tensor | str) -> Tensor:
        """Batched ``a @ b``: both of one rank >= 3 with the same leading (batch) dims."""
        ranks = (len(self._tensor(a).shape), len(self._tensor(b).shape))
        if ranks[0] != ranks[1] or ranks[0] < 3:
            raise GraphError(
                f"operator {name!r}: batch_matmul needs two tensors of one rank >= 3, "
                f"got ranks {ranks[0]} and {ranks[1]}"
            )
        return self.matmul(name, a, b)

    @_atomic
    def conv2d(
        self,
        name: str,
        x: Tensor | str,
        out_channels: int,
        kernel: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        bias: bool = False,
        pool: tuple[int, int] | None = None,
    ) -> Tensor:
        """2-D convolution of ``x`` (b, cin, h, w) with a (cout, cin, kh, kw) weight
        ``name + ".weight"`` (and a (cout,) ``name + ".bias"``). Batch, in- and out-channels are
        partitionable; spatial axes stay whole. ``kernel``, ``stride`` and ``padding`` are ints or
        (h, w) pairs. ``pool=(kernel, stride)`` folds a following pooling into the output shape."""
        x = self._tensor(x)
        if len(x.shape) != 4:
            raise GraphError(
                f"operator {name!r}: conv2d needs a (b, c, h, w) input, got {list(x.shape)}"
            )
        if not _positive_int(out_channels):
            raise GraphError(f"operator {name!r}: out_channels must be a positive int")
        k, s, p = (
            _pair(name, "kernel", kernel, 1),
            _pair(name, "stride", stride, 1),
            _pair(name, "padding", padding, 0),
        )
        _, cin, h, w = x.shape
        ho, wo = (conv_output_size(x.shape[2 + i], k[i], s[i], p[i]) for i in (0, 1))
        if pool is not None:
            pk, ps = _pair(name, "pool", pool, 1)
            ho, wo = conv_output_size(ho, pk, ps), conv_output_size(wo, pk, ps)
        if ho < 1 or wo < 1:
            raise GraphError(f"operator {name!r}: kernel {list(k)} does not fit input {h}x{w}")
        weight = self.parameter(f"{name}.weight", (out_channels, cin, *k), x.dtype_bytes)
        inputs: list[tuple[Tensor | str, Sequence[str]]] = [
            (x, ("b", "ci", "hi", "wi")),
            (weight, ("co", "ci", "kh", "kw")),
        ]
        if bias:
            inputs.append((self.parameter(f"{name}.bias", (out_channels,), x.dtype_bytes), ("co",)))
        return self.add_operator(
            name,
            "conv2d",
            inputs,
            ("b", "co", "ho", "wo"),
            partitionable=("b", "ci", "co"),
            axis_sizes={"ho": ho, "wo": wo},
        )

    def pool(
        self,
        name: str,
        x: Tensor | str,
        kernel: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
    ) -> Tensor:
        """Max or average pooling of ``x`` (b, c, h, w) without padding; ``stride`` defaults to
        ``kernel``. Batch and channels are partitionable, spatial axes whole."""
        x = self._tensor(x)
        if len(x.shape) != 4:
            raise GraphError(
                f"operator {name!r}: pooling needs a (b, c, h, w) input, got {list(x.shape)}"
            )
        k = _pair(name, "kernel", kernel, 1)
        s = k if stride is None else _pair(name, "stride", stride, 1)
        ho, wo = (conv_output_size(x.shape[2 + i], k[i], s[i]) for i in (0, 1))
        if ho < 1 or wo < 1:
            raise GraphError(
                f"operator {name!r}: pooling window {list(k)} does not fit {list(x.shape[2:])}"
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
        """Elementwise ``a + b`` of one shape; every axis partitionable."""
        return self._elementwise(name, "add", a, b)

    def mul(self, name: str, a: Tensor | str, b: Tensor | str) -> Tensor:
        """Elementwise ``a * b`` of one shape; every axis partitionable."""
        return self._elementwise(name, "mul", a, b)

    def relu(self, name: str, x: Tensor | str) -> Tensor:
        return self._elementwise(name, "relu", x)

    def gelu(self, name: str, x: Tensor | str) -> Tensor:
        return self._elementwise(name, "gelu", x)

    @_atomic
    def layernorm(self, name: str, x: Tensor | str) -> Tensor:
        """Layer norm over the last dim (kept whole), with parameters ``name + ".gamma"`` and
        ``name + ".beta"`` of the last dim's size."""
        x = self._tensor(x)
        if not x.shape:
            raise GraphError(f"operator {name!r}: layernorm needs an input of rank >= 1")
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
        if not isinstance(axis, int) or not -len(dims) <= axis < len(dims):
            raise GraphError(f"operator {name!r}: axis {axis} out of range for {list(x.shape)}")
        whole = dims[axis]
        return self.add_operator(
            name, "softmax", [(x, dims)], dims, partitionable=[d for d in dims if d != whole]
        )

    @_atomic
    def embedding(
        self, name: str, ids: Tensor | str, vocab: int, hidden: int, dtype_bytes: int = 2
    ) -> Tensor:
        """Token embedding: ids (b, s) x table ``name + ".table"`` (v, h) -> (b, s, h), modelled as
        a one-hot matmul, so a split vocabulary leaves partial sums. The output has the table's
        ``dtype_bytes``, whatever the ids' integer width."""
        ids = self._tensor(ids)
        lead = _leading(len(ids.shape))
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
        """The tensor behind a chain of views (the tensor itself if it is not a view)."""
        t = self._tensor(tensor)
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
        """The JSON document as Python objects (schema in docs/graph.md)."""
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

    def to_json(self) -> str:
        """The graph as JSON: one line per tensor and per operator, so files diff well."""
        doc = self.to_dict()
        lines = ["{"]
        for key in ("format", "version", "name", "layers"):
            lines.append(f"  {json.dumps(key)}: {json.dumps(doc[key])},")
        for key, last in (("tensors", False), ("ops", True)):
            items = [f"    {json.dumps(item)}" for item in doc[key]]
            body = "[\n" + ",\n".join(items) + "\n  ]" if items else "[]"
            lines.append(f"  {json.dumps(key)}: {body}{'' if last else ','}")
        lines.append("}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Graph:
        """Read a graph written by :meth:`to_json` (schema in docs/graph.md). Errors name the
        field, e.g. ``ops[3].inputs[1].tensor: unknown tensor 'h9'``."""
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise GraphError(f"not JSON: {e}") from None
        except RecursionError:
            raise GraphError("not a graph: JSON nested too deeply") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> Graph:
        """Read the document :meth:`to_dict` makes; see :meth:`from_json`."""
        _fields(data, "", {"format", "version", "name", "layers", "tensors", "ops"})
        fmt, version = _get(data, "", "format", str), _get(data, "", "version", int)
        if fmt != FORMAT:
            raise GraphError(f"format: expected {FORMAT!r}, got {fmt!r}")
        if version != VERSION:
            raise GraphError(f"version: this taps reads version {VERSION}, got {version}")
        name, layers = _get(data, "", "name", str), _get(data, "", "layers", int)
        if layers < 1:
            raise GraphError(f"layers: must be a positive int, got {layers}")
        g = cls(name, layers)
        pending: list[_Pending] = []
        for i, t in enumerate(_get(data, "", "tensors", list)):
            view = _read_tensor(g, t, f"tensors[{i}]")
            if view is not None:
                pending.append(view)
        for i, op in enumerate(_get(data, "", "ops", list)):
            pending.append(_read_op(op, f"ops[{i}]"))
        g._add_in_order(pending)
        return g

    def _add_in_order(self, pending: list[_Pending]) -> None:
        """Add views and operators once what they use exists: always the first ready one in file
        order, so a file in topological order keeps its order. Whatever is left waits on a
        tensor nobody makes, or on a cycle."""
        waiting: dict[str, list[int]] = {}
        missing = []
        ready: list[int] = []
        for i, p in enumerate(pending):
            wanted = {t for _, t in p.uses if t not in self.tensors}
            for t in wanted:
                waiting.setdefault(t, []).append(i)
            missing.append(len(wanted))
            if not wanted:
                ready.append(i)
        heapq.heapify(ready)
        done = set()
        while ready:
            i = heapq.heappop(ready)
            with _At(pending[i].path):
                pending[i].add(self)
            done.add(i)
            for j in waiting.get(pending[i].makes, []):
                missing[j] -= 1
                if not missing[j]:
                    heapq.heappush(ready, j)
        pending = [p for i, p in enumerate(pending) if i not in done]
        if not pending:
            return
        maker = {p.makes: p for p in pending}
        for p in pending:
            for field, t in p.uses:
                if t not in self.tensors and t not in maker:
                    raise GraphError(f"{p.path}.{field}: unknown tensor {t!r}")
        # Every item left waits on another one left: walking back from any of them must come
        # round to an item already seen, which closes a cycle.
        walk = [pending[0]]
        while True:
            nxt = next(maker[t] for _, t in walk[-1].uses if t not in self.tensors)
            if nxt in walk:
                break
            walk.append(nxt)
        cycle = walk[walk.index(nxt) :][::-1]  # data-flow order
        # Start at the operator that comes first in the file (views only if nothing else).
        start = min(range(len(cycle)), key=lambda i: (cycle[i].is_view, pending.index(cycle[i])))
        cycle = cycle[start:] + cycle[:start]
        names = [p.label for p in (*cycle, cycle[0])]
        raise GraphError(f"ops: the graph has a cycle: {' -> '.join(names)}")


# -- JSON reading -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pending:
    """A view or operator read from JSON, added once the tensors it uses exist."""

    path: str
    label: str  # how a cycle message names it
    is_view: bool
    uses: tuple[tuple[str, str], ...]  # (field, tensor name)
    makes: str
    add: Callable[[Graph], None]


class _At:
    """Prefix a GraphError raised inside with the field path it concerns."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: Any, exc: Any, tb: Any) -> None:
        if isinstance(exc, GraphError) and not str(exc).startswith(self.path):
            raise GraphError(f"{self.path}: {exc}") from None


def _fields(obj: Any, path: str, allowed: set[str]) -> None:
    """``obj`` must be an object with no fields but ``allowed`` (a typo is an error, not a
    silently missing option)."""
    if not isinstance(obj, dict):
        raise GraphError(f"{path or 'top level'}: expected an object, got {type(obj).__name__}")
    for key in obj:
        if key not in allowed:
            raise GraphError(f"{path or 'top level'}: unknown field {key!r}")


def _get(obj: dict, path: str, key: str, typ: type) -> Any:
    where = f"{path}.{key}" if path else key
    if key not in obj:
        raise GraphError(f"{where}: missing")
    value = obj[key]
    if (typ is int and isinstance(value, bool)) or not isinstance(value, typ):
        raise GraphError(f"{where}: expected {typ.__name__}, got {value!r}")
    return value


def _list_of(obj: dict, path: str, key: str, typ: type) -> list:
    values = _get(obj, path, key, list)
    for i, v in enumerate(values):
        if (typ is int and isinstance(v, bool)) or not isinstance(v, typ):
            raise GraphError(f"{path}.{key}[{i}]: expected {typ.__name__}, got {v!r}")
    return values


_TENSOR_FIELDS = {
    "input": {"name", "kind", "shape", "dtype_bytes", "requires_grad"},
    "parameter": {"name", "kind", "shape", "dtype_bytes"},
    "view": {"name", "kind", "shape", "dtype_bytes", "base"},
}


def _read_tensor(g: Graph, t: Any, path: str) -> _Pending | None:
    """Add an input or parameter now; return a view, which waits for its base."""
    _fields(t, path, set().union(*_TENSOR_FIELDS.values()))
    kind = _get(t, path, "kind", str)
    if kind not in _TENSOR_FIELDS:
        hint = " (activations are not listed: operators make them)" if kind == "activation" else ""
        raise GraphError(
            f"{path}.kind: expected 'input', 'parameter' or 'view', got {kind!r}{hint}"
        )
    _fields(t, path, _TENSOR_FIELDS[kind])
    name = _get(t, path, "name", str)
    shape = _list_of(t, path, "shape", int)
    dtype = _get(t, path, "dtype_bytes", int)
    if kind == "input":
        requires_grad = _get(t, path, "requires_grad", bool)
        with _At(path):
            g.input(name, shape, dtype, requires_grad)
        return None
    if kind == "parameter":
        with _At(path):
            g.parameter(name, shape, dtype)
        return None
    base = _get(t, path, "base", str)

    def add(g: Graph) -> None:
        if g.tensors[base].dtype_bytes != dtype:
            raise GraphError(
                f"{path}.dtype_bytes: view {name!r} has {dtype} but its base {base!r} has "
                f"{g.tensors[base].dtype_bytes}"
            )
        g.reshape(name, base, shape)

    return _Pending(path, f"view {name!r}", True, (("base", base),), name, add)


def _read_op(op: Any, path: str) -> _Pending:
    _fields(op, path, {"name", "kind", "axes", "partitionable", "inputs", "output"})
    name, kind = _get(op, path, "name", str), _get(op, path, "kind", str)
    sizes: dict[str, int] = {}
    for j, pair in enumerate(_get(op, path, "axes", list)):
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not isinstance(pair[0], str)
            or not _positive_int(pair[1])
        ):
            raise GraphError(f"{path}.axes[{j}]: expected [name, positive size], got {pair!r}")
        if pair[0] in sizes:
            raise GraphError(f"{path}.axes[{j}]: axis {pair[0]!r} is listed twice")
        sizes[pair[0]] = pair[1]
    part = _list_of(op, path, "partitionable", str)
    inputs = []
    for j, operand in enumerate(_get(op, path, "inputs", list)):
        p = f"{path}.inputs[{j}]"
        _fields(operand, p, {"tensor", "dims"})
        inputs.append((_get(operand, p, "tensor", str), _list_of(operand, p, "dims", str)))
    out = _get(op, path, "output", dict)
    _fields(out, f"{path}.output", {"dims", "dtype_bytes"})
    out_dims = _list_of(out, f"{path}.output", "dims", str)
    dtype = _get(out, f"{path}.output", "dtype_bytes", int)

    def add(g: Graph) -> None:
        for field, dims in [
            *((f"inputs[{j}].dims", dims) for j, (_, dims) in enumerate(inputs)),
            ("output.dims", out_dims),
        ]:
            for d in dims:
                if d not in sizes:
                    raise GraphError(f"{path}.{field}: axis {d!r} is not in axes")
        g.add_operator(name, kind, inputs, out_dims, part, sizes, dtype)
        # The file's axis order is the operator's: keep it rather than the inferred one.
        made = g._ops[name]
        g._ops[name] = dataclasses.replace(
            made,
            axes=tuple(sizes),
            axis_sizes=tuple(sizes.values()),
            partitionable=tuple(a for a in sizes if a in made.partitionable),
        )

    uses = tuple((f"inputs[{j}].tensor", t) for j, (t, _) in enumerate(inputs))
    return _Pending(path, repr(name), False, uses, f"{name}.out", add)
