"""Activation checkpointing by layers: which layers keep only their input and run their forward
again in the backward, the share of each operator's saved output the memory then counts, and how
often each operator's forward runs again (docs/search.md#memory).

The layers are the instances of the graph's ties (a model's repeated blocks, in the order of the
ties and of their instances), each ``graph.layers`` times; a graph without ties is one layer
standing for ``graph.layers``. As torchtitan's per-layer option does, every ``every``-th layer
is checkpointed, counting from the first. A checkpointed layer keeps what leaves it (its output,
the next layer's input) and nothing else; its backward recomputes its forward, so one layer's
saved activations are held again while it runs. That buffer is spread evenly over the
checkpointed layers, which is exact when they take the same strategies (tied layers) and their
mean otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from taps.graph import Graph


@dataclass(frozen=True)
class Checkpointing:
    """Per operator (every one of the graph), over the ``graph.layers`` copies of it:

    Attributes:
        kept: the share of what its backward keeps of its output (:attr:`Operator.saved`) that
            device memory holds, per copy: 1 where nothing is checkpointed.
        recomputed: how many more times its forward runs, per copy (0 to 1): the share of its
            copies in checkpointed layers. The step's compute time adds this much forward.
    """

    kept: Mapping[str, float]
    recomputed: Mapping[str, float]


def _layers(graph: Graph) -> list[list[str]]:
    """The layers of one copy of the graph: the instances of its ties, in order; or the whole
    graph, if it has none."""
    if not graph.tied:
        return [[op.name for op in graph.ops]]
    return [list(inst) for group in graph.tied for inst in group]


def checkpointing(graph: Graph, every: int) -> Checkpointing:
    """What checkpointing every ``every``-th layer of ``graph`` keeps and recomputes (``every``
    0: nothing is checkpointed)."""
    kept = dict.fromkeys((op.name for op in graph.ops), 1.0)
    recomputed = dict.fromkeys(kept, 0.0)
    if every:
        layers, copies = _layers(graph), graph.layers
        # Layer t of copy j is the (j * len(layers) + t)-th of the model.
        marked = [
            [(j * len(layers) + t) % every == 0 for j in range(copies)] for t in range(len(layers))
        ]
        total = sum(map(sum, marked))
        consumers: dict[str, set[str]] = {}
        for e in graph.edges:
            consumers.setdefault(e.tensor, set()).add(e.consumer)
        for layer, marks in zip(layers, marked):
            inside = set(layer)
            for name in layer:
                recomputed[name] = sum(marks) / copies
                used_by = consumers.get(graph.op(name).output.tensor, set())
                if used_by and used_by <= inside:
                    # Held by the layers not checkpointed, and once, spread, while recomputed.
                    kept[name] = sum(1 / total if m else 1.0 for m in marks) / copies
    return Checkpointing(MappingProxyType(kept), MappingProxyType(recomputed))
