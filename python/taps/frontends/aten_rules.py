"""The op-rule table of the PyTorch front end: one rule per ATen operator of the training IR
(``torch.export``'s default graph), keyed by the operator's name without its overload.

A rule reads its arguments from the context (:class:`Context`), labels every dim of every operand
and of the output with an axis, and builds operators through the builder; it returns the value of
the node (a :class:`~taps.frontends.builder.Value`, a list of them, or a Python value). The table
is documented in docs/frontends.md. A node whose tensor arguments are all constants never reaches
a rule: its output is a constant too.
"""

from __future__ import annotations

import operator
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from taps.frontends.builder import Builder, Value, constant


class Unsupported(Exception):
    """A rule cannot convert this use of its operator; the message says why."""


class Context(Protocol):
    """What a rule sees of the node it converts."""

    b: Builder
    kind: str  # the operator's name without overload (``add`` for ``aten.add_.Tensor``)
    path: str  # the module path of the node
    args: list[Any]
    kwargs: dict[str, Any]
    shapes: list[tuple[int, ...]]  # of each tensor output
    dtypes: list[int]  # bytes per element (per real part) of each tensor output
    complex_out: bool
    rows: bool  # see (batch, seq, ...) tensors as (batch * seq, ...) rows (:func:`rowable`)

    def arg(self, i: int, name: str, default: Any = None) -> Any: ...

    def order(self) -> list[int] | None: ...


Rule = Callable[[Context], Any]
RULES: dict[str, Rule] = {}


def rule(*names: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for name in names:
            RULES[name] = fn
        return fn

    return register


# -- helpers ---------------------------------------------------------------------------------


def lead(n: int) -> list[str]:
    """Readable labels for ``n`` leading dims."""
    return list("bstu")[:n] if n <= 4 else dim_labels(n)


def dim_labels(rank: int) -> list[str]:
    return [f"d{i}" for i in range(rank)]


def norm_dim(d: int, rank: int) -> int:
    return d % rank if rank else 0


def live(values: Sequence[Any]) -> list[Value]:
    return [v for v in values if isinstance(v, Value) and not v.constant]


def flat(args: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(flat(a))
        else:
            out.append(a)
    return out


def broadcast_labels(v: Value, out_labels: Sequence[str], out_shape: Sequence[int]) -> list[str]:
    """Labels for ``v`` broadcast against the output: aligned from the right; a dim of size 1
    facing a larger one gets a label of its own (a whole axis of size 1)."""
    offset = len(out_shape) - len(v.shape)
    labels = []
    for i, size in enumerate(v.shape):
        j = i + offset
        labels.append(out_labels[j] if size == out_shape[j] else f"one{j}")
    return labels


def rowable(cx: Context, v: Value) -> bool:
    """Whether ``v``, an operand of a node whose output no transpose reads, can be seen with
    its first two dims (batch, seq) as one rows dim: it has the output's first two dims, they
    follow each other in its graph tensor, and the output has rank 3 (batch, seq, features) or
    ``v`` already comes from rows (the heads of a projection's output; not the channels and
    pixels of a convolution's)."""
    out = cx.shapes[0]
    if not (
        cx.rows
        and len(out) >= 3
        and cx.order() is None
        and len(v.shape) == len(out)
        and v.shape[:2] == out[:2]
        and v.perm[1] == v.perm[0] + 1
    ):
        return False
    return len(out) == 3 or from_rows(cx, v)


def from_rows(cx: Context, v: Value) -> bool:
    """Whether the graph tensor behind ``v`` has (batch * seq) rows first."""
    return v.tensor is None or cx.b.shape(cx.b.root(v.tensor))[0] == v.shape[0] * v.shape[1]


def rows(cx: Context, v: Value) -> Value:
    """``v`` with its (batch, seq) dims seen as one rows dim (a view)."""
    return cx.b.reshape(v, (v.shape[0] * v.shape[1], *v.shape[2:]), cx.path, "rows")


def unrows(cx: Context, out: Value) -> Value:
    """An operator's rows output seen with the node's (batch, seq) dims again (a view)."""
    return cx.b.reshape(out, cx.shapes[0], cx.path, "view")


def elementwise(cx: Context, kind: str, values: Sequence[Any]) -> Value:
    """An elementwise operator over the live tensors among ``values`` (constants are computed
    on every device and need no operand), broadcast to the output shape; every axis
    partitionable but a complex tensor's real/imaginary pair. A (batch, seq, ...) operator
    sees (batch * seq, ...) rows, as Megatron-LM's 2-D matmuls do."""
    shape = cx.shapes[0]
    values = live(values)
    hidden = (2,) if cx.complex_out else ()
    if values and all(len(v.shape) <= len(shape) - 2 or rowable(cx, v) for v in values):
        shape2 = (shape[0] * shape[1], *shape[2:])
        operands = [rows(cx, v) if len(v.shape) == len(shape) else v for v in values]
        labels = lead(len(shape2))
        inputs = [(v, broadcast_labels(v, labels, shape2)) for v in operands]
        made = cx.b.op(kind, cx.path, inputs, shape2, labels, cx.dtypes[0], hidden=hidden)
        return unrows(cx, made)
    labels = lead(len(shape))
    inputs = [(v, broadcast_labels(v, labels, shape)) for v in values]
    return cx.b.op(
        kind, cx.path, inputs, shape, labels, cx.dtypes[0], order=cx.order(), hidden=hidden
    )


def tensor_arg(cx: Context, i: int, name: str) -> Value:
    v = cx.arg(i, name)
    if not isinstance(v, Value):
        raise Unsupported(f"argument {name} is not a tensor")
    return v


def op(
    cx: Context,
    kind: str,
    inputs: Sequence[tuple[Value | None, Sequence[str]]],
    out_labels: Sequence[str],
    partitionable: Sequence[str] | None = None,
    addends: Sequence[tuple[Value | None, Sequence[str]]] = (),
) -> Value:
    """An operator of the node's (first) output shape; ``None`` inputs and addends (absent
    optional arguments, such as a missing bias) are left out."""
    return cx.b.op(
        kind,
        cx.path,
        [(v, labels) for v, labels in inputs if v is not None],
        cx.shapes[0],
        out_labels,
        cx.dtypes[0],
        partitionable,
        cx.order(),
        addends=[(v, labels) for v, labels in addends if v is not None],
    )


# -- free: aliases, copies, dtype changes, dropout ------------------------------------------------


@rule(
    "clone",
    "contiguous",
    "detach",
    "alias",
    "lift_fresh_copy",
    "dropout",
    "feature_dropout",
    "alpha_dropout",
    "_to_copy",
    "to",
    "type_as",
    "_assert_tensor_metadata",
)
def free(cx: Context) -> Any:
    """The first argument, unchanged: no data moves between devices (a dtype change keeps the
    graph tensor, whose element size is the producer's)."""
    return cx.args[0]


@rule("native_dropout")
def native_dropout(cx: Context) -> Any:
    return [cx.args[0], constant(cx.shapes[1], 1)]


@rule("_assert_scalar", "sym_constrain_range_for_size", "_assert_async")
def no_value(cx: Context) -> None:
    return None


# -- views and relabellings ----------------------------------------------------------------


@rule(
    "view",
    "reshape",
    "_unsafe_view",
    "flatten",
    "unflatten",
    "squeeze",
    "unsqueeze",
    "view_as",
    "reshape_as",
)
def view(cx: Context) -> Value:
    """A view of the graph tensor (the node's output shape): no operator."""
    return cx.b.reshape(tensor_arg(cx, 0, "self"), cx.shapes[0], cx.path, cx.kind)


@rule("transpose", "swapaxes", "swapdims")
def transpose(cx: Context) -> Value:
    v = tensor_arg(cx, 0, "self")
    n = len(v.shape)
    a, c = norm_dim(cx.args[1], n), norm_dim(cx.args[2], n)
    dims = list(range(n))
    dims[a], dims[c] = dims[c], dims[a]
    return cx.b.permute(v, dims)


@rule("t", "numpy_T")
def t(cx: Context) -> Value:
    v = tensor_arg(cx, 0, "self")
    return cx.b.permute(v, list(range(len(v.shape)))[::-1])


@rule("permute")
def permute(cx: Context) -> Value:
    return cx.b.permute(tensor_arg(cx, 0, "self"), cx.args[1])


@rule("movedim")
def movedim(cx: Context) -> Value:
    v = tensor_arg(cx, 0, "self")
    n = len(v.shape)
    src, dst = cx.args[1], cx.args[2]
    src = [src] if isinstance(src, int) else list(src)
    dst = [dst] if isinstance(dst, int) else list(dst)
    src, dst = [norm_dim(d, n) for d in src], [norm_dim(d, n) for d in dst]
    rest = iter(d for d in range(n) if d not in src)
    placed = dict(zip(dst, src))
    return cx.b.permute(v, [placed[i] if i in placed else next(rest) for i in range(n)])


@rule("view_as_complex")
def view_as_complex(cx: Context) -> Value:
    """The last dim (real, imaginary) becomes hidden."""
    v = tensor_arg(cx, 0, "self")
    return Value(v.tensor, v.shape[:-1], v.perm[:-1], v.dtype_bytes, v.hidden + v.perm[-1:])


@rule("view_as_real")
def view_as_real(cx: Context) -> Value:
    v = tensor_arg(cx, 0, "self")
    if len(v.hidden) != 1:
        raise Unsupported("view_as_real of a tensor that is not complex")
    return Value(v.tensor, (*v.shape, 2), v.perm + v.hidden, v.dtype_bytes)


# -- elementwise ------------------------------------------------------------------------------

UNARY = [
    "relu",
    "gelu",
    "silu",
    "tanh",
    "sigmoid",
    "exp",
    "exp2",
    "expm1",
    "log",
    "log1p",
    "log2",
    "rsqrt",
    "sqrt",
    "neg",
    "abs",
    "reciprocal",
    "sin",
    "cos",
    "erf",
    "hardtanh",
    "leaky_relu",
    "elu",
    "selu",
    "celu",
    "softplus",
    "hardswish",
    "hardsigmoid",
    "mish",
    "relu6",
    "clamp",
    "clamp_min",
    "clamp_max",
    "pow",
    "square",
    "logical_not",
    "bitwise_not",
    "sign",
    "floor",
    "ceil",
    "round",
    "trunc",
    "nan_to_num",
    "triu",
    "tril",
    "sgn",
]
BINARY = [
    "add",
    "sub",
    "rsub",
    "mul",
    "div",
    "true_divide",
    "floor_divide",
    "maximum",
    "minimum",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "logical_and",
    "logical_or",
    "logical_xor",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "masked_fill",
    "where",
    "remainder",
    "fmod",
    "atan2",
    "copysign",
    "lerp",
    "addcmul",
    "addcdiv",
    "hypot",
]


def _elementwise_rule(cx: Context) -> Value:
    return elementwise(cx, cx.kind, flat([*cx.args, *cx.kwargs.values()]))


for _name in (*UNARY, *BINARY):
    RULES[_name] = _elementwise_rule


# -- contractions ---------------------------------------------------------------------------


@rule("linear")
def linear(cx: Context) -> Value:
    """``x (..., in) @ weight (out, in)^T + bias (out)``; ``x (batch, seq, in)`` as rows."""
    x, w, bias = tensor_arg(cx, 0, "input"), tensor_arg(cx, 1, "weight"), cx.arg(2, "bias")
    # The bias is added after the contraction: an addend.
    addends = [(bias, ["out"])] if isinstance(bias, Value) else []
    if rowable(cx, x):
        r = rows(cx, x)
        lead_r = lead(len(r.shape) - 1)
        out = cx.b.op(
            "linear",
            cx.path,
            [(r, [*lead_r, "in"]), (w, ["out", "in"])],
            (*r.shape[:-1], cx.shapes[0][-1]),
            [*lead_r, "out"],
            cx.dtypes[0],
            addends=addends,
        )
        return unrows(cx, out)
    labels = lead(len(x.shape) - 1)
    return op(
        cx, "linear", [(x, [*labels, "in"]), (w, ["out", "in"])], [*labels, "out"], None, addends
    )


@rule("mm")
def mm(cx: Context) -> Value:
    a, c = tensor_arg(cx, 0, "self"), tensor_arg(cx, 1, "mat2")
    return op(cx, "matmul", [(a, ["i", "k"]), (c, ["k", "j"])], ["i", "j"])


@rule("addmm")
def addmm(cx: Context) -> Value:
    """``bias + a @ b`` (the bias broadcast over rows)."""
    bias, a, c = cx.arg(0, "self"), tensor_arg(cx, 1, "mat1"), tensor_arg(cx, 2, "mat2")
    addends: list[tuple[Value | None, Sequence[str]]] = []
    if isinstance(bias, Value) and not bias.constant:
        addends.append((bias, broadcast_labels(bias, ["i", "j"], cx.shapes[0])))
    return op(cx, "linear", [(a, ["i", "k"]), (c, ["k", "j"])], ["i", "j"], None, addends)


@rule("bmm")
def bmm(cx: Context) -> Value:
    a, c = tensor_arg(cx, 0, "self"), tensor_arg(cx, 1, "mat2")
    return op(cx, "matmul", [(a, ["b", "i", "k"]), (c, ["b", "k", "j"])], ["b", "i", "j"])


@rule("matmul")
def matmul(cx: Context) -> Value:
    """``torch.matmul``: vectors promoted, batch dims broadcast."""
    a, c = tensor_arg(cx, 0, "self"), tensor_arg(cx, 1, "other")
    out = cx.shapes[0]
    batch = lead(max(len(a.shape), len(c.shape)) - 2)
    if len(a.shape) == 1 and len(c.shape) == 1:
        return op(cx, "matmul", [(a, ["k"]), (c, ["k"])], [])
    a_labels = ["k"] if len(a.shape) == 1 else ["i", "k"]
    c_labels = ["k"] if len(c.shape) == 1 else ["k", "j"]
    out_labels = batch + [lab for lab in ("i", "j") if lab in a_labels + c_labels]
    full = [*batch, "i", "j"]
    sizes = (*out[: len(batch)], 0, 0)

    def with_batch(v: Value, own: list[str]) -> list[str]:
        nb = len(v.shape) - len(own)
        labels = []
        for i in range(nb):
            j = len(batch) - nb + i
            labels.append(full[j] if v.shape[i] == sizes[j] else f"one{j}")
        return labels + own

    return op(
        cx,
        "matmul",
        [(a, with_batch(a, a_labels)), (c, with_batch(c, c_labels))],
        out_labels,
    )


@rule("einsum")
def einsum(cx: Context) -> Value:
    """Letters are axes; ``...`` becomes leading axes. Every axis partitionable."""
    equation: str = cx.args[0].replace(" ", "")
    tensors = list(cx.args[1])
    lhs, _, rhs = equation.partition("->")
    specs = lhs.split(",")
    if not _:
        letters = sorted(c for c in set(lhs) if c.isalpha() and lhs.count(c) == 1)
        rhs = ("..." if "..." in lhs else "") + "".join(letters)
    spare = [c for c in string.ascii_letters if c not in equation]
    ell_rank = max(
        (len(t.shape) - len(s.replace("...", "")) for s, t in zip(specs, tensors) if "..." in s),
        default=0,
    )
    ell = spare[:ell_rank]

    def expand(spec: str, rank: int) -> list[str]:
        if "..." not in spec:
            return list(spec)
        head, tail = spec.split("...")
        n = rank - len(head) - len(tail)
        return [*head, *ell[ell_rank - n :], *tail]

    inputs = []
    for spec, t in zip(specs, tensors):
        labels = expand(spec, len(t.shape))
        if len(set(labels)) != len(labels):
            raise Unsupported(f"einsum {equation!r} repeats an index within one operand")
        if isinstance(t, Value) and not t.constant:
            inputs.append((t, labels))
    return op(cx, "einsum", inputs, expand(rhs, len(cx.shapes[0])))


# -- convolution and pooling ----------------------------------------------------------------


@rule("conv2d")
def conv2d(cx: Context) -> Value:
    """``x (b, ci, h, w) * weight (co, ci, kh, kw) + bias (co)`` (the bias an addend): batch and
    channels partitionable, spatial axes whole. With ``groups`` > 1 the channels are (groups,
    per group) views, ``x (b, g, ci, h, w) * weight (g, co, ci, kh, kw) + bias (g, co)``: the
    groups are a partitionable axis that neither is contracted nor sums partials (ResNeXt's
    grouped and MobileNet's depthwise convolutions)."""
    x, w, bias = tensor_arg(cx, 0, "input"), tensor_arg(cx, 1, "weight"), cx.arg(2, "bias")
    groups = cx.arg(6, "groups", 1)
    if groups == 1:
        return op(
            cx,
            "conv2d",
            [(x, ["b", "ci", "hi", "wi"]), (w, ["co", "ci", "kh", "kw"])],
            ["b", "co", "ho", "wo"],
            ["b", "ci", "co"],
            [(bias, ["co"])],
        )
    b, _, h, wi = x.shape
    cout, per_group, kh, kw = w.shape
    g, co = groups, cout // groups

    def split(v: Value, what: str, shape: tuple[int, ...], labels: list[str]) -> tuple:
        return cx.b.reshape(v, shape, cx.path, f"{what}_groups"), labels

    inputs = [
        split(x, "input", (b, g, per_group, h, wi), ["b", "g", "ci", "hi", "wi"]),
        split(w, "weight", (g, co, per_group, kh, kw), ["g", "co", "ci", "kh", "kw"]),
    ]
    addends = [split(bias, "bias", (g, co), ["g", "co"])] if isinstance(bias, Value) else []
    out = cx.shapes[0]
    grouped = cx.b.op(
        "conv2d",
        cx.path,
        inputs,
        (out[0], g, co, *out[2:]),
        ["b", "g", "co", "ho", "wo"],
        cx.dtypes[0],
        ["b", "g", "ci", "co"],
        addends=addends,
    )
    return cx.b.reshape(grouped, out, cx.path, "channels")


@rule(
    "max_pool2d",
    "avg_pool2d",
    "adaptive_avg_pool2d",
    "max_pool2d_with_indices",
    "adaptive_max_pool2d",
)
def pool2d(cx: Context) -> Any:
    """Pooling: batch and channels partitionable, spatial axes whole. An adaptive pooling to the
    input's own size is the identity (torchvision's AlexNet at 224x224)."""
    x = tensor_arg(cx, 0, "self")
    out = cx.shapes[0]
    if cx.kind.startswith("adaptive") and out == x.shape:
        result: Any = x
    else:
        n = len(x.shape)
        labels_in = [*lead(n - 2), "hi", "wi"]
        labels_out = [*lead(n - 2), "ho", "wo"]
        result = op(cx, "pool", [(x, labels_in)], labels_out, lead(n - 2))
    if len(cx.shapes) > 1:  # (values, indices)
        return [result, constant(cx.shapes[1], 8)]
    return result


# -- normalisation, softmax, embedding --------------------------------------------------------


def _norm(cx: Context, kind: str, x: Value, params: Sequence[Any], normalized: int) -> Value:
    n = len(x.shape)
    whole = [f"h{i}" if normalized > 1 else "h" for i in range(normalized)]
    ps = [p for p in params if isinstance(p, Value) and not p.constant]
    if normalized == 1 and rowable(cx, x):
        r = rows(cx, x)
        row_labels = [*lead(len(r.shape) - 1), "h"]
        row_inputs = [(r, row_labels), *((p, ["h"]) for p in ps)]
        made = cx.b.op(
            kind, cx.path, row_inputs, r.shape, row_labels, cx.dtypes[0], row_labels[:-1]
        )
        return unrows(cx, made)
    labels = [*lead(n - normalized), *whole]
    inputs: list[tuple[Value | None, Sequence[str]]] = [(x, labels)]
    inputs += [(p, labels[n - len(p.shape) :]) for p in ps]
    return op(cx, kind, inputs, labels, labels[: n - normalized])


@rule("layer_norm")
def layer_norm(cx: Context) -> Value:
    """Normalised dims whole; weight and bias on them."""
    x = tensor_arg(cx, 0, "input")
    shape = cx.arg(1, "normalized_shape")
    return _norm(cx, "layernorm", x, [cx.arg(2, "weight"), cx.arg(3, "bias")], len(shape))


@rule("rms_norm")
def rms_norm(cx: Context) -> Value:
    x = tensor_arg(cx, 0, "input")
    shape = cx.arg(1, "normalized_shape")
    return _norm(cx, "rmsnorm", x, [cx.arg(2, "weight")], len(shape))


@rule("group_norm")
def group_norm(cx: Context) -> Value:
    """Channels and spatial dims whole (groups mix channels); batch partitionable."""
    x = tensor_arg(cx, 0, "input")
    labels = ["b", "c", *dim_labels(len(x.shape))[2:]]
    inputs: list[tuple[Value | None, Sequence[str]]] = [(x, labels)]
    for p in (cx.arg(2, "weight"), cx.arg(3, "bias")):
        if isinstance(p, Value) and not p.constant:
            inputs.append((p, ["c"]))
    return op(cx, "groupnorm", inputs, labels, ["b"])


@rule("batch_norm", "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training")
def batch_norm(cx: Context) -> Any:
    """Per-channel statistics over batch and space: batch and channels partitionable (a split
    batch keeps statistics per device, as data parallelism does), spatial axes whole. Running
    statistics are buffers, not parameters."""
    x = tensor_arg(cx, 0, "input")
    labels = ["b", "c", *(f"x{i}" for i in range(len(x.shape) - 2))]
    inputs: list[tuple[Value | None, Sequence[str]]] = [(x, labels)]
    for p in (cx.arg(1, "weight"), cx.arg(2, "bias")):
        if isinstance(p, Value) and not p.constant:
            inputs.append((p, ["c"]))
    out = op(cx, "batchnorm", inputs, labels, ["b", "c"])
    if len(cx.shapes) > 1:  # (out, mean, invstd, ...): statistics only feed the buffers
        return [out, *(constant(s, d) for s, d in zip(cx.shapes[1:], cx.dtypes[1:]))]
    return out


@rule("softmax", "_softmax", "log_softmax", "_log_softmax")
def softmax(cx: Context) -> Value:
    """The normalised dim whole."""
    x = tensor_arg(cx, 0, "self")
    n = len(x.shape)
    d = norm_dim(cx.arg(1, "dim"), n)
    labels = lead(n)
    kind = "log_softmax" if "log" in cx.kind else "softmax"
    return op(cx, kind, [(x, labels)], labels, [lab for i, lab in enumerate(labels) if i != d])


@rule("embedding")
def embedding(cx: Context) -> Value:
    """``ids (b, s) x table (v, h) -> (b, s, h)``, a one-hot matmul: a split vocabulary leaves
    partial sums."""
    w, ids = tensor_arg(cx, 0, "weight"), tensor_arg(cx, 1, "indices")
    if cx.rows and cx.order() is None and len(ids.shape) == 2 and ids.perm[1] == ids.perm[0] + 1:
        r = rows(cx, ids)
        out = cx.b.op(
            "embedding",
            cx.path,
            [(r, ["b"]), (w, ["v", "h"])],
            (r.shape[0], w.shape[1]),
            ["b", "h"],
            cx.dtypes[0],
        )
        return unrows(cx, out)
    labels = lead(len(ids.shape))
    return op(cx, "embedding", [(ids, labels), (w, ["v", "h"])], [*labels, "h"])


@rule("scaled_dot_product_attention")
def sdpa(cx: Context) -> Value:
    """Three operators as taps.models.gpt builds them: ``scores`` (q k^T), ``softmax`` over the
    keys and ``context`` (probabilities times v); batch, heads and query sequence partitionable,
    the head dim and key sequence whole. With grouped-query attention the heads are (kv heads,
    queries per kv head). A mask that is not a constant is an input of ``scores``."""
    q, k, v = (tensor_arg(cx, i, n) for i, n in enumerate(("query", "key", "value")))
    mask = cx.arg(3, "attn_mask")
    b = cx.b
    *batch_shape, heads, _, _ = q.shape
    kv_heads = k.shape[-3]
    batch = lead(len(batch_shape))
    if heads == kv_heads:
        head, kv_head, split = ["n"], ["n"], [heads]
    else:
        head, kv_head, split = ["g", "r"], ["g"], [kv_heads, heads // kv_heads]
        q = b.reshape(q, (*batch_shape, *split, *q.shape[-2:]), cx.path, "grouped")
    hs = len(head)
    q_l = [*batch, *head, "s", "d"]
    k_l = [*batch, *kv_head, "t", "d"]
    v_l = [*batch, *kv_head, "t", "e"]
    scores_l = [*batch, *head, "s", "t"]
    scores_shape = (*batch_shape, *split, q.shape[-2], k.shape[-2])
    part = [*batch, *head, "s"]
    inputs = [(q, q_l), (k, k_l)]
    if isinstance(mask, Value) and not mask.constant:
        m = mask if heads == kv_heads else b.reshape(mask, mask.shape, cx.path, "mask")
        out_full = dict(zip(scores_l, scores_shape))
        labels = [*batch, "n", "s", "t"] if hs == 1 else None
        if labels is None or len(m.shape) > len(labels):
            raise Unsupported("an attention mask with grouped-query attention")
        offset = len(labels) - len(m.shape)
        inputs.append(
            (
                m,
                [
                    lab if m.shape[i] == out_full.get(lab, 0) else f"one{i + offset}"
                    for i, lab in enumerate(labels[offset:])
                ],
            )
        )
    dtype = cx.dtypes[0]
    scores = b.op("scores", cx.path, inputs, scores_shape, scores_l, dtype, part)
    probs = b.op("softmax", cx.path, [(scores, scores_l)], scores_shape, scores_l, dtype, part)
    out_shape = (*batch_shape, *split, q.shape[-2], v.shape[-1])
    out_l = [*batch, *head, "s", "e"]
    order = cx.order()
    if order is not None and hs == 2:  # the framework's heads dim is two axes here
        nb = len(batch)
        order = [o + (o > nb) for o in order]
        order.insert(order.index(nb) + 1, nb + 1)
    ctx = b.op(
        "context", cx.path, [(probs, scores_l), (v, v_l)], out_shape, out_l, dtype, part, order
    )
    if hs == 2:
        return b.reshape(ctx, cx.shapes[0], cx.path, "heads")
    return ctx


# -- reductions -------------------------------------------------------------------------------


@rule("sum", "mean", "amax", "amin", "max", "min", "var", "std", "prod", "logsumexp", "norm")
def reduction(cx: Context) -> Any:
    """Reduced dims are contracted axes: split, they leave partial results (an all_reduce).
    ``max``/``min`` of two tensors are elementwise."""
    x = tensor_arg(cx, 0, "self")
    if cx.kind in ("max", "min") and isinstance(cx.arg(1, "other"), Value):
        return elementwise(cx, cx.kind, cx.args)
    n = len(x.shape)
    dims = cx.arg(1, "dim")
    if cx.kind == "norm":
        dims = cx.arg(2, "dim")
    if dims is None or dims == [] or isinstance(dims, float):
        dims = list(range(n))
    dims = {norm_dim(d, n) for d in ([dims] if isinstance(dims, int) else dims)}
    keep = len(cx.shapes[0]) == n  # keepdim: the reduced dims stay, of size 1
    if keep and n == 3 and dims == {2} and rowable(cx, x):  # (batch, seq, h) -> (batch, seq, 1)
        r = rows(cx, x)
        made = cx.b.op(
            cx.kind, cx.path, [(r, ["b", "h"])], (r.shape[0], 1), ["b", "kept"], cx.dtypes[0]
        )
        result: Value = unrows(cx, made)
    else:
        labels = lead(n)
        out_labels = []
        for i, lab in enumerate(labels):
            if i not in dims:
                out_labels.append(lab)
            elif keep:
                out_labels.append(f"kept{i}")
        result = cx.b.op(cx.kind, cx.path, [(x, labels)], cx.shapes[0], out_labels, cx.dtypes[0])
    if len(cx.shapes) > 1:  # (values, indices)
        return [result, constant(cx.shapes[1], 8)]
    return result


# -- splitting, slicing, joining ---------------------------------------------------------------


@dataclass(frozen=True)
class Pieces:
    """The outputs of a split along ``dim`` at ``bounds``; each piece becomes an operator when
    something reads it. Equal pieces read ``chunks``, a view with the dim as (pieces, size)."""

    value: Value
    dim: int
    bounds: tuple[int, ...]
    chunks: Value | None


def _take(cx: Context, v: Value, dim: int, start: int, stop: int, kind: str) -> Value:
    """``v`` narrowed to ``[start, stop)`` along ``dim``: an operator whose input dim is whole
    and whose output dim is its own axis (on rows when the dim is not batch or seq)."""
    if dim >= 2 and rowable(cx, v):
        return unrows(cx, _take(_Rowless(cx), rows(cx, v), dim - 1, start, stop, kind))
    n = len(v.shape)
    labels = lead(n)
    in_l = [f"{lab}_in" if i == dim else lab for i, lab in enumerate(labels)]
    out_l = [f"{lab}_out" if i == dim else lab for i, lab in enumerate(labels)]
    shape = list(v.shape)
    shape[dim] = stop - start
    part = [lab for i, lab in enumerate(labels) if i != dim]
    return cx.b.op(kind, cx.path, [(v, in_l)], shape, out_l, cx.dtypes[0], part, cx.order())


def _select(cx: Context, v: Value, dim: int, kind: str) -> Value:
    """One index of ``dim``: the dim is a whole axis the output lacks. If ``v`` views an
    operator's output of which ``dim`` is one factor, the operator is factored first (so a fused
    QKV projection can still be split by heads)."""
    if v.constant:
        return constant(v.shape[:dim] + v.shape[dim + 1 :], v.dtype_bytes)
    cx.b.factor(v, dim, cx.path)
    if (
        dim >= 2
        and cx.rows
        and cx.order() is None
        and len(v.shape) == len(cx.shapes[0]) + 1 >= 3
        and v.shape[:2] == cx.shapes[0][:2]
        and v.perm[1] == v.perm[0] + 1
        and (len(v.shape) == 3 or from_rows(cx, v))
    ):
        return unrows(cx, _select(_Rowless(cx), rows(cx, v), dim - 1, kind))
    n = len(v.shape)
    labels = lead(n)
    in_l = [f"{lab}_sel" if i == dim else lab for i, lab in enumerate(labels)]
    out_l = [lab for i, lab in enumerate(labels) if i != dim]
    shape = v.shape[:dim] + v.shape[dim + 1 :]
    return cx.b.op(kind, cx.path, [(v, in_l)], shape, out_l, cx.dtypes[0], None, cx.order())


class _Rowless:
    """The context of a node already seen as rows: no second merge, and the rows shape."""

    def __init__(self, cx: Context) -> None:
        self._cx = cx
        out = cx.shapes[0]
        self.shapes = [(out[0] * out[1], *out[2:])]
        self.rows = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cx, name)

    def order(self) -> None:
        return None


def piece(cx: Context, p: Pieces, i: int) -> Value:
    start, stop = p.bounds[i], p.bounds[i + 1]
    if p.chunks is not None:
        return _select(cx, p.chunks, p.dim, "split")
    if p.value.constant:
        shape = list(p.value.shape)
        shape[p.dim] = stop - start
        return constant(shape, p.value.dtype_bytes)
    cx.b.factor(p.value, p.dim, cx.path)
    return _take(cx, p.value, p.dim, start, stop, "split")


def _split(cx: Context, sizes: Sequence[int], dim: int) -> Pieces:
    v = tensor_arg(cx, 0, "self")
    bounds = [0]
    for s in sizes:
        bounds.append(bounds[-1] + s)
    chunks = None
    if len(sizes) > 1 and len(set(sizes)) == 1:
        shape = (*v.shape[:dim], len(sizes), sizes[0], *v.shape[dim + 1 :])
        chunks = cx.b.reshape(v, shape, cx.path, "chunks")
    return Pieces(v, dim, tuple(bounds), chunks)


@rule("split", "split_with_sizes")
def split(cx: Context) -> Pieces:
    v = tensor_arg(cx, 0, "self")
    size = cx.arg(1, "split_size")
    dim = norm_dim(cx.arg(2, "dim", 0), len(v.shape))
    if isinstance(size, int):
        total = v.shape[dim]
        sizes = [min(size, total - s) for s in range(0, total, size)]
    else:
        sizes = list(size)
    return _split(cx, sizes, dim)


@rule("chunk")
def chunk(cx: Context) -> Pieces:
    v = tensor_arg(cx, 0, "self")
    dim = norm_dim(cx.arg(2, "dim", 0), len(v.shape))
    return _split(cx, [s[dim] for s in cx.shapes], dim)


@rule("unbind")
def unbind(cx: Context) -> Pieces:
    """Pieces of size 1 along ``dim``, each a ``select``."""
    v = tensor_arg(cx, 0, "self")
    dim = norm_dim(cx.arg(1, "dim", 0), len(v.shape))
    return Pieces(v, dim, tuple(range(v.shape[dim] + 1)), v)


@rule("select")
def select(cx: Context) -> Value:
    v = tensor_arg(cx, 0, "self")
    return _select(cx, v, norm_dim(cx.args[1], len(v.shape)), "select")


@rule("slice", "narrow")
def slice_(cx: Context) -> Value:
    """A slice of the whole dim is free; else the dim is whole in the input."""
    v = tensor_arg(cx, 0, "self")
    n = len(v.shape)
    dim = norm_dim(cx.arg(1, "dim", 0), n)
    out = cx.shapes[0]
    if out == v.shape:
        return v
    return _take(cx, v, dim, 0, out[dim], "slice")


@rule("getitem")
def getitem(cx: Context) -> Any:
    seq, i = cx.args[0], cx.args[1]
    if isinstance(seq, Pieces):
        return piece(cx, seq, i)
    return operator.getitem(seq, i)


@rule("cat", "concat", "concatenate")
def cat(cx: Context) -> Value:
    """The joined dim is an axis of its own in every operand (whole); other dims are shared."""
    tensors = [t for t in cx.args[0] if isinstance(t, Value)]
    out = cx.shapes[0]
    n = len(out)
    dim = norm_dim(cx.arg(1, "dim", 0), n)
    labels = lead(n)
    inputs = []
    for k, t in enumerate(tensors):
        if t.constant or t.shape[dim] == 0:
            continue
        inputs.append((t, [f"{lab}_{k}" if i == dim else lab for i, lab in enumerate(labels)]))
    out_l = [f"{lab}_cat" if i == dim else lab for i, lab in enumerate(labels)]
    part = [lab for i, lab in enumerate(labels) if i != dim]
    return cx.b.op("cat", cx.path, inputs, out, out_l, cx.dtypes[0], part, cx.order())


@rule("stack")
def stack(cx: Context) -> Value:
    tensors = live(cx.args[0])
    out = cx.shapes[0]
    dim = norm_dim(cx.arg(1, "dim", 0), len(out))
    labels = lead(len(out))
    own = [lab for i, lab in enumerate(labels) if i != dim]
    part = own
    return cx.b.op(
        "stack", cx.path, [(t, own) for t in tensors], out, labels, cx.dtypes[0], part, cx.order()
    )


@rule("expand", "expand_as", "broadcast_to")
def expand(cx: Context) -> Value:
    """Broadcast copies: the new or grown dims are output-only axes."""
    v = tensor_arg(cx, 0, "self")
    out = cx.shapes[0]
    if tuple(out) == v.shape:
        return v
    labels = lead(len(out))
    return cx.b.op(
        "expand",
        cx.path,
        [(v, broadcast_labels(v, labels, out))],
        out,
        labels,
        cx.dtypes[0],
        order=cx.order(),
    )
