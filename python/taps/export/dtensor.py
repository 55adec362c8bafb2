"""A taps plan as a PyTorch ``DeviceMesh`` shape and DTensor placements per tensor.

Plain data: computing it needs no torch. Each placement list has one entry per mesh dim
(outermost first): ``Shard(i)`` where the mesh dim splits tensor dim ``i``, ``Partial()`` where
the layout holds partial sums along it (the devices that differ only there hold addends whose sum
is the tensor: DTensor's ``Partial("sum")``), ``Replicate()`` elsewhere. A tensor dim split over
several mesh dims lists ``Shard(i)`` on each of them; DTensor splits in mesh-dim order, the first
the major one, which is the taps order (see :mod:`.mesh`).
:meth:`DTensorPlacements.placements` builds the torch objects (``pip install 'taps[torch]'``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from taps._core import Layout
from taps._support.extras import require
from taps.errors import ExportError
from taps.export.document import to_text
from taps.export.roots import root_layouts
from taps.export.storage import stored_axes, stored_groups
from taps.plan.layouts import PlanLayouts
from taps.plan.mesh import Mesh

FORMAT = "taps.export.dtensor"
VERSION = 1


PARTIAL = "Partial()"
REPLICATE = "Replicate()"


def layout_placements(mesh: Mesh, layout: Layout) -> tuple[str, ...]:
    """Per mesh dim, ``"Shard(i)"``, ``"Partial()"`` or ``"Replicate()"`` for ``layout``."""
    owner = {a: f"Shard({i})" for i, axes in enumerate(mesh.dim_axes(layout)) for a in axes}
    summed = [k for k in layout.partial if layout.device_dim_size(k) > 1]  # a sum of one is none
    owner.update({a: PARTIAL for a in mesh.group_axes(layout, summed)})
    return tuple(owner.get(a, REPLICATE) for a in mesh.axis_names)


def stored_placements(mesh: Mesh, layout: Layout, group: tuple[int, ...]) -> tuple[str, ...]:
    """The placements of a parameter in ``layout`` stored sharded over the device dims ``group``
    (FSDP2's ``Shard(0)`` on the group's mesh dims; :mod:`taps.export.storage`)."""
    owner = {a: f"Shard({i})" for i, axes in stored_axes(mesh, layout, group).items() for a in axes}
    return tuple(owner.get(a, REPLICATE) for a in mesh.axis_names)


def placement_objects(texts: Sequence[str]) -> list[Any]:
    """The torch placement objects of placements as text (``"Shard(1)"``, ``"Partial()"``,
    ``"Replicate()"``)."""
    dtensor = require("torch.distributed.tensor", "torch", "DTensor placements")
    out = []
    for p in texts:
        if p == REPLICATE:
            out.append(dtensor.Replicate())
        elif p == PARTIAL:
            out.append(dtensor.Partial("sum"))
        elif p.startswith("Shard(") and p.endswith(")") and p[6:-1].isdigit():
            out.append(dtensor.Shard(int(p[6:-1])))
        else:
            raise ExportError(f"unknown placement {p!r}")
    return out


@dataclass(frozen=True)
class DTensorPlacements:
    """The device mesh and the placements of every tensor of a plan.

    Attributes:
        mesh: the mesh; ``mesh.shape`` is the ``init_device_mesh`` shape and ``mesh.axis_names``
            its ``mesh_dim_names`` (ranks in order: rank ``r`` is position ``r`` of the mesh).
        tensors: placements per graph tensor (parameters and inputs at their first reader, or
            its view's layout carried back to them, activations as produced, views at their first
            reader); a parameter the plan stores sharded (FSDP) as stored
            (:func:`stored_placements`), gathered to its reader's placements; each buffer of
            the module (when given) that the graph does not read, replicated (a constant,
            computed whole on every device).
        operators: per operator, ``{"inputs": [placements per slot], "output": placements}``.
    """

    mesh: Mesh
    tensors: dict[str, tuple[str, ...]]
    operators: dict[str, dict[str, Any]]

    @classmethod
    def from_layouts(cls, layouts: PlanLayouts, buffers: Iterable[str] = ()) -> DTensorPlacements:
        """The placements of ``layouts``; ``buffers`` (a module's buffer names) replicated
        where the graph reads none of them."""
        mesh = layouts.mesh
        roots = root_layouts(layouts)
        tensors = {name: layout_placements(mesh, lay) for name, lay in roots.items()}
        for name, group in stored_groups(layouts.plan).items():
            tensors[name] = stored_placements(mesh, roots[name], group)
        for name in buffers:
            tensors.setdefault(name, (REPLICATE,) * len(mesh.shape))
        return cls(
            mesh,
            tensors,
            {
                op.name: {
                    "inputs": [layout_placements(mesh, lay) for lay in layouts.inputs[op.name]],
                    "output": layout_placements(mesh, layouts.outputs[op.name]),
                }
                for op in layouts.plan.graph.ops
            },
        )

    def placements(self, tensor: str) -> list[Any]:
        """The torch placement objects of a graph tensor."""
        if tensor not in self.tensors:
            raise ExportError(f"unknown tensor {tensor!r}")
        return placement_objects(self.tensors[tensor])

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (docs/export.md)."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "mesh": {"shape": list(self.mesh.shape), "dim_names": list(self.mesh.axis_names)},
            "tensors": {name: list(p) for name, p in self.tensors.items()},
            "operators": {
                name: {"inputs": [list(p) for p in e["inputs"]], "output": list(e["output"])}
                for name, e in self.operators.items()
            },
        }

    def to_json(self) -> str:
        """The JSON document as text, one line per tensor and operator."""
        return to_text(self.to_dict())
