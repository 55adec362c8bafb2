"""Where a plan stores the parameters it shards (FSDP / ZeRO-3, docs/export.md#sharded-storage),
placed as the exports place them (torch's ``fully_shard`` on the modules that hold them is
:mod:`taps.export.fsdp`).

An operator that stores its parameters sharded (``plan.pricing.fsdp``) keeps each of them split
over the device dims its gradient is reduced over (its data-parallel dims), as FSDP2 does: dim 0
of the parameter is split over those dims too, on top of whatever the strategy splits, and the
parameter is all-gathered to the layout the strategy computes with before the forward and the
backward. The exports place such a parameter in that stored layout: DTensor ``Shard(0)`` on the
group's mesh dims, a JAX ``PartitionSpec`` whose first entry adds the group's mesh axes (XLA's
partitioner then gathers it where an operator reads it whole).
"""

from __future__ import annotations

from taps._core import Layout
from taps.plan.mesh import Mesh
from taps.plan.plan import Plan
from taps.search.prices import FORWARD_GATHER, intra_collectives, partial_flows


def stored_groups(plan: Plan) -> dict[str, tuple[int, ...]]:
    """Per parameter (root tensor) the plan stores sharded, the device dims of its reader's
    device matrix it is sharded over: the group of its gathers (the dims its gradient is reduced
    over)."""
    graph, pricing = plan.graph, plan.pricing
    flows = partial_flows(graph, pricing.step)
    out: dict[str, tuple[int, ...]] = {}
    for op in graph.ops:
        if not pricing.shards(op.name):
            continue
        found = intra_collectives(
            graph,
            op,
            plan.candidates[op.name],
            pricing.step,
            op.name in flows,
            sharded=True,
        )
        for c in found:
            if c.reason == FORWARD_GATHER:
                group = [
                    k for k in range(len(c.layout.device_matrix)) if k not in c.layout.tensor_map
                ]
                out.setdefault(graph.root(c.tensor).name, tuple(group))
    return out


def stored_axes(mesh: Mesh, layout: Layout, group: tuple[int, ...]) -> dict[int, tuple[str, ...]]:
    """Per tensor dim of ``layout`` stored sharded over the device dims ``group`` too, its mesh
    axes in mesh order (outermost first): dim 0 takes the group's axes as well as its own."""
    axes = {i: a for i, a in enumerate(mesh.dim_axes(layout)) if a}
    extra = set(mesh.group_axes(layout, group))
    first = set(axes.get(0, ())) | extra
    axes[0] = tuple(a for a in mesh.axis_names if a in first)
    return axes
