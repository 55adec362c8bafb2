"""A taps plan as a JAX mesh and a ``PartitionSpec`` per tensor.

Computing the plan needs no JAX; :meth:`JaxShardings.mesh`, :meth:`JaxShardings.partition_spec` and
:meth:`JaxShardings.sharding` import it (``pip install 'taps[jax]'``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from taps._core import Layout
from taps._support.extras import require
from taps.errors import ExportError
from taps.export.document import to_text
from taps.export.roots import root_layouts
from taps.export.storage import stored_axes, stored_groups
from taps.frontends.jax.convert import leaf_name
from taps.plan.layouts import PlanLayouts
from taps.plan.mesh import Mesh

#: One entry per tensor dim: ``None`` (whole), one mesh axis, or several (outermost first).
SpecEntry = str | tuple[str, ...] | None
Spec = tuple[SpecEntry, ...]

FORMAT = "taps.export.jax"
VERSION = 1


def import_jax() -> Any:
    """``jax``, or a ``MissingExtraError`` naming the extra to install."""
    return require("jax", "jax", "a JAX mesh and shardings")


def layout_spec(mesh: Mesh, layout: Layout) -> Spec:
    """The ``PartitionSpec`` entries of ``layout`` on ``mesh``."""
    return tuple(_entry(axes) for axes in mesh.dim_axes(layout))


def _entry(axes: tuple[str, ...]) -> SpecEntry:
    return None if not axes else axes[0] if len(axes) == 1 else axes


def stored_spec(mesh: Mesh, layout: Layout, group: tuple[int, ...]) -> Spec:
    """The ``PartitionSpec`` entries of a parameter in ``layout`` stored sharded over the device
    dims ``group`` (FSDP: its first dim over the group's mesh axes too;
    :mod:`taps.export.storage`)."""
    axes = stored_axes(mesh, layout, group)
    return tuple(_entry(axes.get(i, ())) for i in range(len(layout.shape)))


def jax_mesh(mesh: Mesh, devices: Any = None) -> Any:
    """``jax.sharding.Mesh`` of ``mesh`` over ``devices`` (default: the first ``n`` of
    ``jax.devices()``), taken in rank order."""
    jax = import_jax()
    import numpy as np

    devices = list(jax.devices() if devices is None else devices)
    if len(devices) < mesh.num_devices:
        raise ExportError(
            f"the plan needs {mesh.num_devices} devices, JAX has {len(devices)} (on CPU: set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={mesh.num_devices} before JAX "
            "starts)"
        )
    array = np.array(devices[: mesh.num_devices], dtype=object).reshape(mesh.shape)
    return jax.sharding.Mesh(array, mesh.axis_names)


def named_sharding(mesh: Any, spec: Spec) -> Any:
    """``NamedSharding(mesh, PartitionSpec(*spec))``."""
    jax = import_jax()
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))


def _spec_json(spec: Spec) -> list:
    return [None if e is None else [e] if isinstance(e, str) else list(e) for e in spec]


@dataclass(frozen=True)
class JaxShardings:
    """The mesh and the sharding of every tensor of a plan.

    Attributes:
        mesh: the mesh (shape outermost first, axis ``"d0"`` innermost; see :mod:`.mesh`).
        tensors: ``PartitionSpec`` entries per graph tensor: every parameter and input (at its
            first reader; a parameter the plan stores sharded, FSDP, as stored:
            :func:`stored_spec`), activation (as its producer makes it) and view (at its first
            reader).
        operators: per operator, ``{"inputs": [spec per slot], "output": spec}``: the layout each
            input has after its redistribution, for ``with_sharding_constraint`` at the reader.
    """

    mesh: Mesh
    tensors: dict[str, Spec]
    operators: dict[str, dict[str, Any]]

    @classmethod
    def from_layouts(cls, layouts: PlanLayouts) -> JaxShardings:
        mesh = layouts.mesh
        roots = root_layouts(layouts)
        tensors = {name: layout_spec(mesh, lay) for name, lay in roots.items()}
        for name, group in stored_groups(layouts.plan).items():
            tensors[name] = stored_spec(mesh, roots[name], group)
        operators = {
            op.name: {
                "inputs": [layout_spec(mesh, lay) for lay in layouts.inputs[op.name]],
                "output": layout_spec(mesh, layouts.outputs[op.name]),
            }
            for op in layouts.plan.graph.ops
        }
        return cls(mesh, tensors, operators)

    def jax_mesh(self, devices: Any = None) -> Any:
        """The ``jax.sharding.Mesh`` (see :func:`jax_mesh`)."""
        return jax_mesh(self.mesh, devices)

    def partition_spec(self, tensor: str) -> Any:
        """The ``jax.sharding.PartitionSpec`` of a graph tensor."""
        return import_jax().sharding.PartitionSpec(*self._spec(tensor))

    def sharding(self, tensor: str, mesh: Any = None) -> Any:
        """The ``NamedSharding`` of a graph tensor on ``mesh`` (default :meth:`jax_mesh`)."""
        return named_sharding(self.jax_mesh() if mesh is None else mesh, self._spec(tensor))

    def tree(self, tree: Any, prefix: str = "", mesh: Any = None) -> Any:
        """``tree`` (an argument of the function given to :func:`taps.from_jax`: a pytree of
        arrays, a flax ``nnx.State``, ...) with every leaf replaced by its ``NamedSharding`` on
        ``mesh`` (default :meth:`jax_mesh`), for ``jax.device_put`` and ``jax.jit``'s
        ``in_shardings``. Leaves are named as the front end names them: ``prefix`` is the
        argument's name (``"ids"``), empty for the parameters (with several parameter arguments,
        each one's name)."""
        jax = import_jax()
        mesh = self.jax_mesh() if mesh is None else mesh
        return jax.tree_util.tree_map_with_path(
            lambda path, _: self.sharding(leaf_name(prefix, path), mesh), tree
        )

    def _spec(self, tensor: str) -> Spec:
        if tensor not in self.tensors:
            raise ExportError(f"unknown tensor {tensor!r}")
        return self.tensors[tensor]

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (docs/export.md)."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "mesh": self.mesh.to_dict(),
            "tensors": {name: _spec_json(s) for name, s in self.tensors.items()},
            "operators": {
                name: {
                    "inputs": [_spec_json(s) for s in entry["inputs"]],
                    "output": _spec_json(entry["output"]),
                }
                for name, entry in self.operators.items()
            },
        }

    def to_json(self) -> str:
        """The JSON document as text, one line per tensor and operator."""
        return to_text(self.to_dict())
