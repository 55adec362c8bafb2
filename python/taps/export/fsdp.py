"""torch's ``fully_shard`` (FSDP2) applied to the modules whose parameters a plan stores sharded
(docs/export.md#sharded-storage)."""

from __future__ import annotations

from typing import Any

from taps._support.extras import require
from taps.errors import ExportError
from taps.export.dtensor import DTensorPlacements
from taps.export.roots import root_layouts
from taps.export.storage import stored_groups
from taps.plan.layouts import layouts_of
from taps.plan.plan import Plan

#: torch dtypes by bytes per element, for the plan's weight and gradient dtypes.
_DTYPES = {2: "bfloat16", 4: "float32"}


def fully_shard_plan(module: Any, plan: Plan, mesh: Any) -> dict[str, tuple[str, ...]]:
    """Apply torch's ``fully_shard`` (FSDP2) to every submodule of ``module`` holding a parameter
    ``plan`` stores sharded, over the sub-mesh of ``mesh`` (a ``DeviceMesh`` with the shape and
    dim names of :func:`taps.export.to_dtensor`'s mesh) its gathers run on, with
    ``reshard_after_forward=True`` (taps prices a gather before the backward too) and the plan's
    dtypes (``MixedPrecisionPolicy``: the weight in ``parameter_bytes``, the gradient reduced in
    ``gradient_bytes``). Returns the submodules sharded, each with its mesh dims.

    The graph's parameter names are the module's (:func:`taps.from_torch`), so a parameter's
    submodule is its name up to the last dot. The parameters must be plain tensors: an operator
    whose strategy also splits a parameter it shards (tensor parallelism under FSDP) is refused
    with an :class:`ExportError`. The process group must be initialised."""
    torch = require("torch", "torch", "fully_shard")
    fsdp = require("torch.distributed.fsdp", "torch", "fully_shard")
    layouts = layouts_of(plan)
    mesh_axes = DTensorPlacements.from_layouts(layouts).mesh
    roots = root_layouts(layouts)
    wanted: dict[str, tuple[str, ...]] = {}
    for name, group in stored_groups(plan).items():
        layout = roots[name]
        if any(m >= 0 for m in layout.tensor_map):
            raise ExportError(
                f"fully_shard_plan: parameter {name!r} is split by its operator's strategy too "
                "(tensor parallelism under FSDP is not applied by this helper)"
            )
        owner = name.rpartition(".")[0]
        axes = mesh_axes.group_axes(layout, group)
        if wanted.setdefault(owner, axes) != axes:
            raise ExportError(
                f"fully_shard_plan: module {owner!r} holds parameters sharded over different "
                f"mesh dims ({wanted[owner]} and {axes})"
            )
    pricing = plan.pricing
    policy = fsdp.MixedPrecisionPolicy(
        param_dtype=_dtype(torch, pricing.parameter_bytes),
        reduce_dtype=_dtype(torch, pricing.gradient_bytes),
    )
    for owner, axes in wanted.items():
        sub = mesh[axes] if len(axes) == 1 else mesh[axes]._flatten()
        fsdp.fully_shard(
            module.get_submodule(owner), mesh=sub, reshard_after_forward=True, mp_policy=policy
        )
    return wanted


def _dtype(torch: Any, size: int | None) -> Any:
    """The torch dtype of ``size`` bytes per element (None: the module's own)."""
    return None if size is None else getattr(torch, _DTYPES[size])
