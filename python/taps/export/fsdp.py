"""torch's ``fully_shard`` (FSDP2) applied to the modules whose parameters a plan stores sharded,
with torch's tensor parallelism (``parallelize_module``) on the modules whose parameters the
plan's strategies split (docs/export.md#sharded-storage)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from taps._core import Layout
from taps._support.extras import require
from taps.errors import ExportError
from taps.export.roots import root_layouts
from taps.export.storage import stored_groups
from taps.plan.layouts import PlanLayouts, layouts_of
from taps.plan.mesh import Mesh
from taps.plan.plan import Plan

#: torch dtypes by bytes per element, for the plan's weight and gradient dtypes.
_DTYPES = {2: "bfloat16", 4: "float32"}

#: The tensor-parallel style of a module by its kind and the weight dim its strategy splits:
#: a ``Linear`` weight is ``[out, in]``, an ``Embedding`` weight ``[vocab, dim]``.
_STYLES = {("Linear", 0): "colwise", ("Linear", 1): "rowwise"}
_STYLES.update({("Embedding", 0): "rowwise", ("Embedding", 1): "colwise"})


@dataclass(frozen=True)
class Sharded:
    """How :func:`fully_shard_plan` applied the plan to one submodule.

    Attributes:
        mesh_axes: the mesh dims ``fully_shard`` shards its parameters over (the plan's gather
            group: the data-parallel dims).
        style: ``"colwise"`` or ``"rowwise"`` (torch's ``ColwiseParallel`` /
            ``RowwiseParallel``) when the plan's strategy splits its weight, else ``None``.
        tp_axes: the mesh dims of that split (empty without one).
    """

    mesh_axes: tuple[str, ...]
    style: str | None = None
    tp_axes: tuple[str, ...] = ()


def fully_shard_plan(module: Any, plan: Plan, mesh: Any) -> dict[str, Sharded]:
    """Apply ``plan``'s parameter storage and tensor parallelism to ``module`` as torch users do
    on a multi-dimensional ``DeviceMesh`` (``mesh``, with the shape and dim names of
    :func:`taps.export.to_dtensor`'s mesh; the process group initialised): every submodule whose
    weight the plan's strategy splits (a ``Linear`` or an ``Embedding``, one weight dim over some
    mesh dims) gets ``parallelize_module`` with ``ColwiseParallel`` or ``RowwiseParallel`` on the
    sub-mesh of those dims, then every submodule holding a parameter the plan stores sharded gets
    ``fully_shard`` (FSDP2) on the sub-mesh of its gather group (flattened when several dims),
    ``reshard_after_forward=True`` (taps prices a gather before the backward too) and the plan's
    dtypes (``MixedPrecisionPolicy``: the weight in ``parameter_bytes``, the gradient reduced in
    ``gradient_bytes``). Returns what each such submodule got.

    The graph's parameter names are the module's (:func:`taps.from_torch`), so a parameter's
    submodule is its name up to the last dot. The module then runs its own forward on each rank's
    local blocks, as Megatron-style tensor parallelism does, so a plan is refused with an
    :class:`ExportError` unless that is the plan: a column-split module reads its input
    replicated over its tensor-parallel dims and a row-split one its input's features split
    over them and gives its output whole there (an all-reduce), with no other movement on the
    edges around them."""
    torch = require("torch", "torch", "fully_shard")
    fsdp = require("torch.distributed.fsdp", "torch", "fully_shard")
    layouts = layouts_of(plan)
    roots = root_layouts(layouts)
    applied: dict[str, Sharded] = {}
    styles = _tensor_parallel(module, layouts)
    for name, group in stored_groups(plan).items():
        owner = name.rpartition(".")[0]
        found = Sharded(layouts.mesh.group_axes(roots[name], group), *styles.get(owner, (None, ())))
        if applied.setdefault(owner, found) != found:
            raise ExportError(
                f"fully_shard_plan: module {owner!r} holds parameters sharded over different "
                f"mesh dims ({applied[owner].mesh_axes} and {found.mesh_axes})"
            )
    for owner, (style, tp_axes) in styles.items():
        applied.setdefault(owner, Sharded((), style, tp_axes))
    tp = require("torch.distributed.tensor.parallel", "torch", "fully_shard")
    kinds = {"colwise": tp.ColwiseParallel, "rowwise": tp.RowwiseParallel}
    for owner, (style, tp_axes) in styles.items():
        tp.parallelize_module(module.get_submodule(owner), _sub_mesh(mesh, tp_axes), kinds[style]())
    pricing = plan.pricing
    policy = fsdp.MixedPrecisionPolicy(
        param_dtype=_dtype(torch, pricing.parameter_bytes),
        reduce_dtype=_dtype(torch, pricing.gradient_bytes),
    )
    for owner, done in applied.items():
        if done.mesh_axes:
            fsdp.fully_shard(
                module.get_submodule(owner),
                mesh=_sub_mesh(mesh, done.mesh_axes),
                reshard_after_forward=True,
                mp_policy=policy,
            )
    return applied


def _sub_mesh(mesh: Any, axes: tuple[str, ...]) -> Any:
    """The sub-mesh of ``mesh`` over ``axes``, flattened to one dim when there are several."""
    return mesh[axes] if len(axes) == 1 else mesh[axes]._flatten()


def _tensor_parallel(module: Any, layouts: PlanLayouts) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Per submodule whose parameter the plan's strategy splits, its style and tensor-parallel
    mesh dims, checked against the plan (:func:`fully_shard_plan`)."""
    torch = require("torch", "torch", "fully_shard")
    graph, mesh = layouts.plan.graph, layouts.mesh
    roots = root_layouts(layouts)
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for op in graph.ops:
        for o in op.inputs:
            root = graph.root(o.tensor)
            if root.kind != "parameter":
                continue
            split = [(i, a) for i, a in enumerate(mesh.dim_axes(roots[root.name])) if a]
            if not split:
                continue
            owner = root.name.rpartition(".")[0]
            kind = _kind(torch, module.get_submodule(owner))
            style = _STYLES.get((kind, split[0][0])) if len(split) == 1 else None
            if style is None:
                raise ExportError(
                    f"fully_shard_plan: parameter {root.name!r} is split along dims "
                    f"{[i for i, _ in split]} of a {kind}: torch's tensor parallelism splits one "
                    "dim of a Linear's or an Embedding's weight"
                )
            found = (style, split[0][1])
            if out.setdefault(owner, found) != found:
                raise ExportError(
                    f"fully_shard_plan: module {owner!r} is split two ways ({out[owner]} and "
                    f"{found})"
                )
            data = next(
                i for i, d in enumerate(op.inputs) if graph.root(d.tensor).kind != "parameter"
            )
            features = (kind, style) == ("Linear", "rowwise")
            _check_local(layouts, mesh, op.name, data, features, found[1])
    return out


def _check_local(
    layouts: PlanLayouts, mesh: Mesh, op: str, data: int, features: bool, axes: tuple[str, ...]
) -> None:
    """An :class:`ExportError` unless operator ``op``, split over ``axes``, computes as the
    module's forward on the local blocks does: its data input (slot ``data``) split there along
    its last dim (``features``: a row-split Linear) or else replicated over ``axes``, and every
    edge into and out of it moving nothing but an all-reduce of its output over ``axes`` (the
    output of a split contraction made whole)."""
    x = layouts.inputs[op][data]
    tp = set(axes)
    held = mesh.dim_axes(x)
    if features:
        local = held[-1] == axes and not tp & set().union(*map(set, held[:-1]))
    else:
        local = not tp & mesh.used_axes(x) and not _partial_over(mesh, x, tp)
    moves = [
        (e, r) for e, r in layouts.redistributions if op in (e.producer, e.consumer) and r.all_ops
    ]
    for e, r in moves:
        reduce = [c for c in r.all_ops if c.kind == "all_reduce"]
        if not (
            e.producer == op
            and len(reduce) == len(r.all_ops)
            and set(mesh.group_axes(r.source, [c.device_dim for c in reduce])) == tp
        ):
            local = False
    if not local:
        raise ExportError(
            f"fully_shard_plan: operator {op!r} is not Megatron-style tensor parallelism over "
            f"{axes} on local blocks (its input or an edge around it moves data otherwise)"
        )


def _kind(torch: Any, module: Any) -> str:
    """``"Linear"``, ``"Embedding"`` or else the module's class name."""
    for kind in ("Linear", "Embedding"):
        if isinstance(module, getattr(torch.nn, kind)):
            return kind
    return type(module).__name__


def _partial_over(mesh: Mesh, layout: Layout, axes: set[str]) -> bool:
    """Whether ``layout`` holds partial sums along any of ``axes``."""
    return bool(axes & set(mesh.group_axes(layout, layout.partial)))


def _dtype(torch: Any, size: int | None) -> Any:
    """The torch dtype of ``size`` bytes per element (None: the module's own)."""
    return None if size is None else getattr(torch, _DTYPES[size])
