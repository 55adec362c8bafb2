"""Where every parameter and input is placed, also one that every operator reads through a view
(a fused QKV weight split in three, a depthwise convolution's weight seen as groups, a layer
scale reshaped to broadcast): its first reader's view layout carried back to the tensor's own
shape; and a stack of them (``Graph.stack``: a scanned JAX leaf), as its first slice, whole
along the stacked axis."""

from __future__ import annotations

import math
from collections.abc import Sequence

from taps._core import Layout
from taps.plan.layouts import PlanLayouts


def _spans(shape: Sequence[int]) -> list[tuple[int, int]]:
    """Per dim, ``(stride, stride * size)``: the part of the row-major flattened index it holds."""
    return [(math.prod(shape[i + 1 :]), math.prod(shape[i:])) for i in range(len(shape))]


def reshaped(layout: Layout, shape: Sequence[int]) -> Layout:
    """``layout`` seen as the row-major reshape ``shape`` of its tensor, each device dim
    splitting the dim that holds the same top factor of the flattened index; where no dim of
    ``shape`` does (an inner factor, or two device dims on one dim), the tensor is whole
    there (the reader's redistribution then moves it, as for any other layout)."""
    old, new = _spans(layout.shape), _spans(shape)
    tensor_map = [-1] * len(shape)
    for j, k in enumerate(layout.tensor_map):
        if k < 0:
            continue
        top = old[j][1]
        block = top // layout.device_dim_size(k)
        i = next((i for i, (s, t) in enumerate(new) if t == top and block % s == 0), None)
        if i is not None and tensor_map[i] < 0:
            tensor_map[i] = k
    return Layout(list(shape), layout.device_matrix, tensor_map)


def root_layouts(layouts: PlanLayouts) -> dict[str, Layout]:
    """Every tensor's layout under the plan (:attr:`PlanLayouts.tensors`); for each parameter
    and input read only through views, its first reader's view layout reshaped to it
    (:func:`reshaped`); for each stack, its first piece's layout whole along the stacked axis:
    every parameter, input and stack of the graph with a reader is placed."""
    graph = layouts.plan.graph
    out = dict(layouts.tensors)
    for op in graph.ops:
        for o in op.inputs:
            root = graph.root(o.tensor)
            if root.name not in out and root.producer is None:
                out[root.name] = reshaped(layouts.tensors[o.tensor], root.shape)
    for name, (pieces, axis) in graph.stacks.items():  # declared after their pieces
        first = out.get(pieces[0])
        if first is not None:
            shape, tensor_map = list(first.shape), list(first.tensor_map)
            shape.insert(axis, len(pieces))
            tensor_map.insert(axis, -1)
            out[name] = Layout(shape, first.device_matrix, tensor_map)
    return out
