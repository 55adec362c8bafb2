"""Identical repeated blocks of a converted module (the layers of a ``ModuleList``), found so
that :meth:`taps.Graph.tie` can declare them repeats."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from taps.frontends.torch._extra import require_torch
from taps.frontends.torch.program import Conversion
from taps.graph import Graph


def _block_signature(graph: Graph, names: Sequence[str]) -> tuple[Any, ...]:
    """What makes two blocks repeats of each other: per operator, everything but names, and
    where each input comes from (an operator of the block by position, or outside)."""
    index = {n: i for i, n in enumerate(names)}
    sig = []
    for n in names:
        op = graph.op(n)
        inputs = []
        for o in op.inputs:
            t, root = graph.tensors[o.tensor], graph.root(o.tensor)
            source = index.get(root.producer or "", -1) if root.kind == "activation" else -1
            # An input from outside the block comes from a different producer in every
            # instance (the one before it): its root's shape need not agree.
            root_shape = root.shape if source >= 0 else None
            inputs.append((o.dims, t.shape, t.kind, root.kind, root_shape, t.dtype_bytes, source))
        # Graph.signature is what Graph.tie compares (it also holds gradients and parameters).
        sig.append((op.kind, graph.signature(n), op.output.dims, tuple(inputs)))
    return tuple(sig)


def repeated_blocks(conversion: Conversion, module: Any) -> list[list[list[str]]]:
    """Identical repeated blocks of a converted module: for every ``ModuleList``,
    ``ModuleDict`` or ``Sequential`` (outermost first), its children whose operators have the
    same signature (kinds, axes, sizes, operand shapes and the wiring inside the block), grouped.
    Each group lists its instances (two or more), each the operator names of one child in graph
    order, aligned by position. A block inside an instance already grouped is not grouped
    again."""
    torch = require_torch()
    containers = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)
    ops_of: dict[str, list[str]] = {}
    for op_name, path in conversion.module_of.items():
        ops_of.setdefault(path, []).append(op_name)
    order = {op.name: i for i, op in enumerate(conversion.graph.ops)}
    covered: set[str] = set()
    found: list[list[list[str]]] = []
    for path, mod in module.named_modules():
        if not isinstance(mod, containers) or any(
            path == c or path.startswith(c + ".") for c in covered
        ):
            continue
        by_sig: dict[tuple[Any, ...], list[tuple[str, list[str]]]] = {}
        for child_name, child in mod.named_children():
            child_path = f"{path}.{child_name}" if path else child_name
            names = sorted(
                (
                    n
                    for p, ns in ops_of.items()
                    if p == child_path or p.startswith(child_path + ".")
                    for n in ns
                ),
                key=order.__getitem__,
            )
            if len(names) < 2:  # a single operator gains nothing from a tie
                continue
            key = (type(child).__qualname__, _block_signature(conversion.graph, names))
            by_sig.setdefault(key, []).append((child_path, names))
        for members in by_sig.values():
            if len(members) > 1:
                found.append([names for _, names in members])
                covered.update(p for p, _ in members)
    return found
