"""The rule for elementwise ATen operators, and which operators are elementwise."""

from __future__ import annotations

from taps.frontends.torch.builder import AtenValue
from taps.frontends.torch.rules._context import Context, elementwise, flat

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
    "triu",
    "tril",
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
