"""The builder vocabulary of :class:`Graph`: ``linear``, ``conv2d``, ``layernorm``, ``embedding``,
... Each is a few calls to the IR's :meth:`~taps.graph.ir.GraphIR.add_operator` and
:meth:`~taps.graph.ir.GraphIR.parameter`; nothing here touches the IR's internals."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from taps._core import GraphError
from taps.graph import serialize
from taps.graph.ir import GraphIR
from taps.graph.records import Tensor, is_positive_int


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
    def wrapper(self, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self.atomic():
            return method(self, *args, **kwargs)

    return wrapper


class Graph(GraphIR):
    """A computation graph of einsum operators: the IR (:class:`~taps.graph.ir.GraphIR`), the
    builders below, each a few calls to the IR's public methods, and the JSON form."""

    # -- JSON (taps.graph.serialize) -----------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON document as Python objects (schema in docs/graph.md)."""
        return serialize.to_dict(self)

    def to_json(self) -> str:
        """The graph as JSON: one line per tensor and per operator, so files diff well."""
        return serialize.to_json(self)

    @classmethod
    def from_json(cls, text: str | bytes) -> Graph:
        """Read a graph written by :meth:`to_json` (schema in docs/graph.md). Errors name the
        field, e.g. ``ops[3].inputs[1].tensor: unknown tensor 'h9'``."""
        return serialize.from_json(text, cls)

    @classmethod
    def from_dict(cls, data: Any) -> Graph:
        """Read the document :meth:`to_dict` makes; see :meth:`from_json`."""
        return serialize.from_dict(data, cls)

    def einsum(
        self,
        name: str,
        spec: str,
        *tensors: Tensor | str,
        partitionable: Iterable[str] | None = None,
        kind: str = "einsum",
        saved: str = "output",
    ) -> Tensor:
        """An operator from an explicit einsum spec such as ``"bi,io->bo"``; each letter is an
        axis, and every output letter must appear in an input. ``saved``: what the backward keeps
        of the output (:attr:`taps.graph.Operator.saved`)."""
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
            saved=saved,
        )

    @_atomic
    def linear(self, name: str, x: Tensor | str, out_features: int, bias: bool = False) -> Tensor:
        """``x @ W`` (+ ``b``) over the last dim of ``x``, with the parameters ``name + ".weight"``
        of shape (in, out) and ``name + ".bias"`` of shape (out,), an addend (added after the
        contraction). Every axis is partitionable."""
        x = self.tensor(x)
        if not x.shape:
            raise GraphError(f"operator {name!r}: linear needs an input of rank >= 1")
        lead = _leading(len(x.shape) - 1)
        w = self.parameter(f"{name}.weight", (x.shape[-1], out_features), x.dtype_bytes)
        inputs: list[tuple[Tensor | str, Sequence[str]]] = [(x, (*lead, "in")), (w, ("in", "out"))]
        addends: list[tuple[Tensor | str, Sequence[str]]] = []
        if bias:
            addends.append(
                (self.parameter(f"{name}.bias", (out_features,), x.dtype_bytes), ("out",))
            )
        return self.add_operator(name, "linear", inputs, (*lead, "out"), addends=addends)

    def matmul(self, name: str, a: Tensor | str, b: Tensor | str) -> Tensor:
        """``a @ b`` over axes ``(..., i, k, j)``: ``...ik,...kj->...ij`` when both carry the same
        leading (batch) dims, or ``...ik,kj->...ij`` when ``b`` is a matrix."""
        a, b = self.tensor(a), self.tensor(b)
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
        ranks = (len(self.tensor(a).shape), len(self.tensor(b).shape))
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
        groups: int = 1,
    ) -> Tensor:
        """2-D convolution of ``x`` (b, cin, h, w) with a (cout, cin, kh, kw) weight
        ``name + ".weight"`` (and a (cout,) ``name + ".bias"``). Batch, in- and out-channels are
        partitionable; spatial axes stay whole. ``kernel``, ``stride`` and ``padding`` are ints or
        (h, w) pairs. ``pool=(kernel, stride)`` folds a following pooling into the output shape.

        ``groups`` > 1 convolves each of ``groups`` slices of the channels on its own: the weight
        is (cout, cin / groups, kh, kw), and the operator reads views with the channels as
        (groups, per group) (``name + ".input_groups"``, ``".weight_groups"``, ``".bias_groups"``),
        the groups a partitionable axis ``g``; the output is viewed back as (b, cout, ho, wo)
        (``name + ".channels"``)."""
        x = self.tensor(x)
        if len(x.shape) != 4:
            raise GraphError(
                f"operator {name!r}: conv2d needs a (b, c, h, w) input, got {list(x.shape)}"
            )
        if not is_positive_int(out_channels):
            raise GraphError(f"operator {name!r}: out_channels must be a positive int")
        k, s, p = (
            _pair(name, "kernel", kernel, 1),
            _pair(name, "stride", stride, 1),
            _pair(name, "padding", padding, 0),
        )
        b, cin, h, w = x.shape
        if not is_positive_int(groups) or cin % groups or out_channels % groups:
            raise GraphError(
                f"operator {name!r}: groups must be a positive int dividing the {cin} input and "
                f"{out_channels} output channels, got {groups!r}"
            )
        ho, wo = (conv_output_size(x.shape[2 + i], k[i], s[i], p[i]) for i in (0, 1))
        if pool is not None:
            pk, ps = _pair(name, "pool", pool, 1)
            ho, wo = conv_output_size(ho, pk, ps), conv_output_size(wo, pk, ps)
        if ho < 1 or wo < 1:
            raise GraphError(f"operator {name!r}: kernel {list(k)} does not fit input {h}x{w}")
        weight = self.parameter(f"{name}.weight", (out_channels, cin // groups, *k), x.dtype_bytes)
        bias_t = self.parameter(f"{name}.bias", (out_channels,), x.dtype_bytes) if bias else None
        sizes = {"ho": ho, "wo": wo}
        if groups == 1:
            return self.add_operator(
                name,
                "conv2d",
                [(x, ("b", "ci", "hi", "wi")), (weight, ("co", "ci", "kh", "kw"))],
                ("b", "co", "ho", "wo"),
                ("b", "ci", "co"),
                sizes,
                addends=[] if bias_t is None else [(bias_t, ("co",))],
            )
        g, ci, co = groups, cin // groups, out_channels // groups
        inputs: list[tuple[Tensor | str, Sequence[str]]] = [
            (
                self.reshape(f"{name}.input_groups", x, (b, g, ci, h, w)),
                ("b", "g", "ci", "hi", "wi"),
            ),
            (
                self.reshape(f"{name}.weight_groups", weight, (g, co, ci, *k)),
                ("g", "co", "ci", "kh", "kw"),
            ),
        ]
        addends: list[tuple[Tensor | str, Sequence[str]]] = []
        if bias_t is not None:
            addends.append((self.reshape(f"{name}.bias_groups", bias_t, (g, co)), ("g", "co")))
        # A depthwise convolution has one channel per group: nothing to split there.
        split = [a for a, size in zip(("b", "g", "ci", "co"), (b, g, ci, co)) if size > 1]
        out = self.add_operator(
            name, "conv2d", inputs, ("b", "g", "co", "ho", "wo"), split, sizes, addends=addends
        )
        return self.reshape(f"{name}.channels", out, (b, out_channels, ho, wo))

    def pool(
        self,
        name: str,
        x: Tensor | str,
        kernel: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
    ) -> Tensor:
        """Max or average pooling of ``x`` (b, c, h, w) without padding; ``stride`` defaults to
        ``kernel``. Batch and channels are partitionable, spatial axes whole."""
        x = self.tensor(x)
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
        ts = [self.tensor(t) for t in tensors]
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
        x = self.tensor(x)
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

    def softmax(self, name: str, x: Tensor | str, axis: int = -1, saved: str = "output") -> Tensor:
        """Softmax along ``axis`` (kept whole); ``saved`` as :meth:`einsum`'s (``"rows"``: the
        logsumexp of fused attention)."""
        x = self.tensor(x)
        dims = _dim_names(len(x.shape))
        if not isinstance(axis, int) or not -len(dims) <= axis < len(dims):
            raise GraphError(f"operator {name!r}: axis {axis} out of range for {list(x.shape)}")
        whole = dims[axis]
        return self.add_operator(
            name,
            "softmax",
            [(x, dims)],
            dims,
            partitionable=[d for d in dims if d != whole],
            saved=saved,
        )

    @_atomic
    def embedding(
        self, name: str, ids: Tensor | str, vocab: int, hidden: int, dtype_bytes: int = 2
    ) -> Tensor:
        """Token embedding: ids (b, s) x table ``name + ".table"`` (v, h) -> (b, s, h), modelled as
        a one-hot matmul, so a split vocabulary leaves partial sums. The output has the table's
        ``dtype_bytes``, whatever the ids' integer width."""
        ids = self.tensor(ids)
        lead = _leading(len(ids.shape))
        table = self.parameter(f"{name}.table", (vocab, hidden), dtype_bytes)
        return self.add_operator(
            name,
            "embedding",
            [(ids, lead), (table, ("v", "h"))],
            (*lead, "h"),
            dtype_bytes=dtype_bytes,
        )
