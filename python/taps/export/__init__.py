"""Plans out to frameworks: a :class:`taps.Plan` as a JAX mesh and a ``PartitionSpec`` per
tensor (:mod:`.jax`), as a PyTorch ``DeviceMesh`` shape and DTensor placements per tensor
(:mod:`.dtensor`), or applied to a torch module (:mod:`.distribute`); a pipelined plan as
``torch.distributed.pipelining`` stages and JAX meshes per stage (:mod:`.pipeline`;
docs/export.md)."""

from __future__ import annotations

from typing import Any

from taps._support.arguments import instance
from taps.errors import ExportError
from taps.export.distribute import DistributedModule, distribute_module
from taps.export.dtensor import DTensorPlacements, layout_placements, placement_objects
from taps.export.jax import JaxShardings, layout_spec
from taps.export.pipeline import (
    DTensorPipeline,
    JaxPipeline,
    TorchPipeline,
    to_dtensor_pipeline,
    to_jax_pipeline,
    to_pipeline,
)
from taps.plan.layouts import PlanLayouts, layouts_of
from taps.plan.mesh import Mesh, mesh_for
from taps.plan.plan import Plan

FRAMEWORKS = ("jax", "dtensor")


def to_jax(plan: Plan) -> JaxShardings:
    """The JAX mesh and a ``PartitionSpec`` per tensor of ``plan``."""
    return JaxShardings.from_layouts(layouts_of(plan))


def to_dtensor(plan: Plan, module: Any = None) -> DTensorPlacements:
    """The DeviceMesh shape and DTensor placements per tensor of ``plan``; given the torch
    ``module`` the plan is of, every buffer of it too (those the graph does not read are
    constants, replicated)."""
    if module is not None and not callable(getattr(module, "named_buffers", None)):
        raise TypeError(
            f"to_dtensor: module must be a torch.nn.Module or None, got {type(module).__name__}"
        )
    buffers = [name for name, _ in module.named_buffers()] if module is not None else []
    return DTensorPlacements.from_layouts(layouts_of(plan), buffers)


def check_framework(framework: str) -> None:
    """An :class:`ExportError` unless ``framework`` is one :func:`export` knows."""
    if framework not in FRAMEWORKS:
        raise ExportError(f"unknown framework {framework!r}: expected 'jax' or 'dtensor'")


def export(
    plan: Plan, framework: str
) -> JaxShardings | DTensorPlacements | JaxPipeline | DTensorPipeline:
    """:func:`to_jax` or :func:`to_dtensor` by name (``"jax"`` or ``"dtensor"``); for a pipelined
    plan, :func:`to_jax_pipeline` or :func:`to_dtensor_pipeline`."""
    check_framework(framework)
    instance("export", "plan", plan, Plan)
    if plan.stages:
        return to_jax_pipeline(plan) if framework == "jax" else to_dtensor_pipeline(plan)
    return to_jax(plan) if framework == "jax" else to_dtensor(plan)


__all__ = [
    "FRAMEWORKS",
    "DTensorPipeline",
    "DTensorPlacements",
    "DistributedModule",
    "ExportError",
    "JaxPipeline",
    "JaxShardings",
    "Mesh",
    "PlanLayouts",
    "TorchPipeline",
    "check_framework",
    "distribute_module",
    "export",
    "layout_placements",
    "layout_spec",
    "layouts_of",
    "mesh_for",
    "placement_objects",
    "to_dtensor",
    "to_dtensor_pipeline",
    "to_jax",
    "to_jax_pipeline",
    "to_pipeline",
]
