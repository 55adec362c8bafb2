"""Expert weights placed one expert at a time, for a module that keeps its experts apart (a
``ModuleList`` of per-expert linears) while taps plans them stacked, ``[e, ...]``.

The stacked weight's DTensor placements split its expert dim over some mesh axes (``Shard(0)``
there: expert parallelism) and place its other dims over the rest (``Shard(j)`` for tensor
parallelism inside each expert, ``Replicate()`` for data parallelism around it). Expert ``i`` then
lives on the devices whose coordinates along the expert axes hold its block of experts, block
``i // (e / degree)`` in mixed radix, the first expert axis the most significant (DTensor's and
taps' order); there it is placed over the remaining mesh axes as the stacked weight is, its
``Shard(j)`` counted without the expert dim. That sub-mesh is exactly ``device_mesh[rest]`` on
those devices, so placing an expert takes no new process group, and a device holds only its own
experts, as expert-parallel training does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from taps._support.extras import require
from taps.errors import ExportError
from taps.export.dtensor import PARTIAL, DTensorPlacements, placement_objects
from taps.frontends.torch.moe import expert_keys
from taps.graph import Graph


@dataclass(frozen=True)
class ExpertPlacement:
    """Where one expert of a stacked weight lives and how it is placed there.

    Attributes:
        expert: its index along the stacked weight's expert dim.
        coordinates: per expert mesh axis (the axes that split the expert dim), the coordinate of
            the devices holding it.
        mesh_axes: the sub-mesh's axes (every mesh axis but the expert ones), outermost first.
        placements: one per sub-mesh axis, for the expert's own tensor (without the expert dim).
        ranks: the ranks holding it, in the sub-mesh's row-major order.
    """

    expert: int
    coordinates: dict[str, int]
    mesh_axes: tuple[str, ...]
    placements: tuple[str, ...]
    ranks: tuple[int, ...]


def expert_placements(
    placements: DTensorPlacements, tensor: str, count: int, axis: int = 0
) -> list[ExpertPlacement]:
    """Per expert of the stacked ``tensor`` (``count`` experts along its dim ``axis``), where it
    lives and its placements there (module doc)."""
    if tensor not in placements.tensors:
        raise ExportError(f"unknown tensor {tensor!r}")
    texts = placements.tensors[tensor]
    if PARTIAL in texts:
        raise ExportError(f"tensor {tensor!r} holds partial sums: no expert has a placement")
    mesh = placements.mesh
    split = f"Shard({axis})"
    expert_axes = [a for a, p in zip(mesh.axis_names, texts) if p == split]
    rest = [(a, p) for a, p in zip(mesh.axis_names, texts) if p != split]
    sizes = [mesh.shape[mesh.axis_names.index(a)] for a in expert_axes]
    degree = math.prod(sizes)
    if count < 1 or count % degree:
        raise ExportError(
            f"tensor {tensor!r}: {count} experts do not split evenly over {degree} devices"
        )
    ranks = np.arange(mesh.num_devices).reshape(mesh.shape)
    out = []
    for i in range(count):
        coords = dict(zip(expert_axes, np.unravel_index(i // (count // degree), sizes)))
        index = tuple(int(coords[a]) if a in coords else slice(None) for a in mesh.axis_names)
        out.append(
            ExpertPlacement(
                i,
                {a: int(c) for a, c in coords.items()},
                tuple(a for a, _ in rest),
                tuple(_without(p, axis) for _, p in rest),
                tuple(int(r) for r in ranks[index].reshape(-1)),
            )
        )
    return out


def _without(placement: str, axis: int) -> str:
    """A placement of the stacked weight as one of its experts takes it: dims after the expert
    dim move down by one."""
    if placement.startswith("Shard("):
        dim = int(placement[6:-1])
        return f"Shard({dim - (dim > axis)})"
    return placement


def distribute_experts(
    experts: Sequence[Any],
    placements: DTensorPlacements,
    tensor: str,
    device_mesh: Any,
    axis: int = 0,
) -> dict[int, Any]:
    """The experts this rank holds, each as a DTensor on its sub-mesh of ``device_mesh`` (a torch
    ``DeviceMesh`` of the plan's mesh shape and axis names): ``experts[i]`` is expert ``i``'s
    weight (the stacked ``tensor``'s slice ``i`` along ``axis``), the same on every rank. An
    expert whose sub-mesh is this device alone is its plain tensor."""
    from torch.distributed.tensor import distribute_tensor

    where = expert_placements(placements, tensor, len(experts), axis)
    rank = device_mesh.get_rank()
    out: dict[int, Any] = {}
    for e, w in zip(experts, where):
        if rank not in w.ranks:
            continue
        if not w.mesh_axes:
            out[w.expert] = e
            continue
        sub = device_mesh[w.mesh_axes if len(w.mesh_axes) > 1 else w.mesh_axes[0]]
        # Every rank has the whole expert: each keeps its block, nothing is sent.
        out[w.expert] = distribute_tensor(
            e, sub, placement_objects(w.placements), src_data_rank=None
        )
    return out


def stacked_parameters(params: Mapping[str, Any], graph: Graph) -> dict[str, Any]:
    """A module's parameters (by ``state_dict`` key) as ``graph`` holds them: the weights of a
    ``ModuleList`` of experts, one per expert, stacked (``torch.stack``: gradients reach each
    expert's own) under the graph's name of them (``experts.*.w1.weight``,
    :func:`taps.frontends.torch.moe.expert_keys`), where the first expert's was; the others as
    they are."""
    stacks: dict[str, list[str]] = {}
    for t in graph.tensors.values():
        keys = expert_keys(t.name, t.shape[0]) if t.kind == "parameter" and t.shape else None
        if keys is not None and all(k in params for k in keys):
            stacks[t.name] = keys
    if not stacks:
        return dict(params)
    torch = require("torch", "torch", "stacked_parameters")
    first = {keys[0]: name for name, keys in stacks.items()}
    held = {k for keys in stacks.values() for k in keys}
    out: dict[str, Any] = {}
    for key, p in params.items():
        if key in first:
            out[first[key]] = torch.stack([params[k] for k in stacks[first[key]]])
        elif key not in held:
            out[key] = p
    return out
