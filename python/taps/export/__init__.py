"""Plans out to frameworks: a JAX mesh and ``PartitionSpec`` per tensor, or a PyTorch
``DeviceMesh`` shape and DTensor placements per tensor, from a search result or any assignment of
strategies, and a plan applied to a torch module (:func:`distribute_module`; docs/export.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from taps._core import Cluster, Strategy
from taps.errors import ExportError
from taps.export.distribute import DistributedModule, distribute_module
from taps.export.dtensor import DTensorPlan, layout_placements, placement_objects
from taps.export.jax import JaxPlan, layout_spec
from taps.graph import Graph
from taps.plan.layouts import PlanLayouts, plan_layouts
from taps.plan.mesh import Mesh, mesh_for

if TYPE_CHECKING:
    from taps.search.searching import SearchResult

FRAMEWORKS = ("jax", "dtensor")


def layouts_of(
    source: SearchResult | Graph,
    cluster: Cluster | None = None,
    strategies: Mapping[str, Strategy] | None = None,
) -> PlanLayouts:
    """The layouts of a search result, or of ``graph`` under ``strategies`` on ``cluster``."""
    if isinstance(source, Graph):
        if strategies is None:
            raise ExportError("exporting a graph needs its strategies")
        return plan_layouts(source, strategies, cluster)
    return plan_layouts(source.graph, source.strategies, source.cluster)


def to_jax(
    source: SearchResult | Graph,
    cluster: Cluster | None = None,
    strategies: Mapping[str, Strategy] | None = None,
) -> JaxPlan:
    """The JAX mesh and a ``PartitionSpec`` per tensor of a plan."""
    return JaxPlan.from_layouts(layouts_of(source, cluster, strategies))


def to_dtensor(
    source: SearchResult | Graph,
    cluster: Cluster | None = None,
    strategies: Mapping[str, Strategy] | None = None,
) -> DTensorPlan:
    """The DeviceMesh shape and DTensor placements per tensor of a plan."""
    return DTensorPlan.from_layouts(layouts_of(source, cluster, strategies))


def check_framework(framework: str) -> None:
    """An :class:`ExportError` unless ``framework`` is one :func:`export` knows."""
    if framework not in FRAMEWORKS:
        raise ExportError(f"unknown framework {framework!r}: expected 'jax' or 'dtensor'")


def export(source: SearchResult | Graph, framework: str, **kwargs: object) -> JaxPlan | DTensorPlan:
    """:func:`to_jax` or :func:`to_dtensor` by name (``"jax"`` or ``"dtensor"``)."""
    check_framework(framework)
    fn = to_jax if framework == "jax" else to_dtensor
    return fn(source, **kwargs)  # type: ignore[arg-type]


__all__ = [
    "FRAMEWORKS",
    "DTensorPlan",
    "DistributedModule",
    "ExportError",
    "JaxPlan",
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
    "plan_layouts",
    "to_dtensor",
    "to_jax",
]
