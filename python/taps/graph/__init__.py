"""The operator graph: tensors, einsum operators over named axes, views, and their JSON form.

Every operator is an einsum over named axes (docs/conventions.md, "Intra-operator
communication"): each operand dim is one axis, an axis in the inputs but not the output is
contracted, and the operator says which axes may be split. A reshape is not an operator: it makes
a *view* whose edge carries the change of shape, which the redistribution planner handles.

The package: :mod:`~taps.graph.records` (tensors, operands, operators, edges),
:mod:`~taps.graph.ir` (the IR: tensors and operators in order, the validating
``add_operator``, ties, queries), :mod:`~taps.graph.builders` (:class:`Graph`: the IR plus
``linear``, ``conv2d``, ...), :mod:`~taps.graph.serialize` (the JSON form).
"""

from taps.graph.builders import Graph, conv_output_size
from taps.graph.records import (
    MOE_COMBINE,
    MOE_DISPATCH,
    MOE_EXPERT,
    MOE_ROUTE,
    SHARE,
    TENSOR_KINDS,
    Edge,
    Operand,
    Operator,
    Tensor,
)
from taps.graph.serialize import FORMAT, VERSION

__all__ = [
    "FORMAT",
    "MOE_COMBINE",
    "MOE_DISPATCH",
    "MOE_EXPERT",
    "MOE_ROUTE",
    "SHARE",
    "TENSOR_KINDS",
    "VERSION",
    "Edge",
    "Graph",
    "Operand",
    "Operator",
    "Tensor",
    "conv_output_size",
]
