"""Plans out to frameworks: a :class:`taps.Plan` as a JAX mesh and a ``PartitionSpec`` per
tensor (:mod:`.jax`), as a PyTorch ``DeviceMesh`` shape and DTensor placements per tensor
(:mod:`.dtensor`), or applied to a torch module (:mod:`.distribute`; docs/export.md)."""

from __future__ import annotations

from taps.errors import ExportError
from taps.export.distribute import DistributedModule, distribute_module
from taps.export.dtensor import DTensorPlacements, layout_placements, placement_objects
from taps.export.jax import JaxShardings, layout_spec
from taps.plan.layouts import PlanLayouts, layouts_of
from taps.plan.mesh import Mesh, mesh_for
from taps.plan.plan import Plan

FRAMEWORKS = ("jax", "dtensor")


def to_jax(plan: Plan) -> JaxShardings:
    """The JAX mesh and a ``PartitionSpec`` per tensor of ``plan``."""
    return JaxShardings.from_layouts(layouts_of(plan))


def to_dtensor(plan: Plan) -> DTensorPlacements:
    """The DeviceMesh shape and DTensor placements per tensor of ``plan``."""
    return DTensorPlacements.from_layouts(layouts_of(plan))


def check_framework(framework: str) -> None:
    """An :class:`ExportError` unless ``framework`` is one :func:`export` knows."""
    if framework not in FRAMEWORKS:
        raise ExportError(f"unknown framework {framework!r}: expected 'jax' or 'dtensor'")


def export(plan: Plan, framework: str) -> JaxShardings | DTensorPlacements:
    """:func:`to_jax` or :func:`to_dtensor` by name (``"jax"`` or ``"dtensor"``)."""
    check_framework(framework)
    return to_jax(plan) if framework == "jax" else to_dtensor(plan)


__all__ = [
    "FRAMEWORKS",
    "DTensorPlacements",
    "DistributedModule",
    "ExportError",
    "JaxShardings",
    "Mesh",
    "PlanLayouts",
    "check_framework",
    "distribute_module",
    "export",
    "layout_placements",
    "layout_spec",
    "layouts_of",
    "mesh_for",
    "placement_objects",
    "to_dtensor",
    "to_jax",
]
