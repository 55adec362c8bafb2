"""The rule for elementwise ATen operators, and which operators are elementwise."""

from __future__ import annotations

from taps.frontends.torch.builder import AtenValue
from taps.frontends.torch.rules._context import Context, elementwise, flat, lead, op, tensor_arg

#: Elementwise ATen operators of one tensor (and scalar options).
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
    "sgn",
]
#: Elementwise ATen operators of two or three tensors.
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


def pointwise(cx: Context) -> AtenValue:
    """A unary, binary or ternary ATen operator (``relu``, ``add``, ``where``, ...): one
    elementwise operator of its name over its non-constant operands, broadcast."""
    return elementwise(cx, cx.kind, flat([*cx.args, *cx.kwargs.values()]))


def triangle(cx: Context) -> AtenValue:
    """``triu``, ``tril``: a ``triu``/``tril`` operator, elementwise but for the matrix (last
    two) dims, which stay whole: whether an element is kept depends on its row and column,
    which a device holding a block would not know."""
    x = tensor_arg(cx, 0, "self")
    labels = lead(len(x.shape))
    return op(cx, cx.kind, [(x, labels)], labels, labels[:-2])
