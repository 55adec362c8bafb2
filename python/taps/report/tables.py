"""Terminal reports: rich tables for redistribution plans and search results."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from taps._core import Cluster, Layout, Redistribution, inter_node_groups
from taps.plan.experts import expert_splits
from taps.plan.plan import Plan
from taps.report.priced import Priced
from taps.search.evaluate import OpCost
from taps.search.prices import GATHERS
from taps.search.searching import Comparison, SearchResult

if TYPE_CHECKING:
    from taps.plan.pricing import CostModel


def as_text(name: str) -> str:
    """A name from a graph (an operator, tensor, axis or the graph's own) as rich markup that
    shows exactly its text: its brackets escaped (``[b]act`` is not bold, ``[/]`` not an error)
    and its control characters written as Python writes them (an escape sequence would drive
    the terminal)."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)
    return escape(text)


def format_seconds(seconds: float) -> str:
    """A duration with a unit a reader can take in at a glance."""
    if seconds == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3f} {unit}"
    return f"{seconds / 1e-9:.3f} ns"


def format_bytes(n: float) -> str:
    """A byte count in binary units."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def format_cost(cost: float, model: CostModel) -> str:
    return format_seconds(cost) if model == "topology" else format_bytes(cost)


def layout_text(layout: Layout) -> str:
    return f"shape {layout.shape}  device matrix {layout.device_matrix}  map {layout.tensor_map}"


def plan_table(
    plan: Redistribution, cluster: Cluster, dtype_bytes: float = 2, title: str = "Redistribution"
) -> Table:
    """One row per op of the plan: what it does, its group, volume, ct and cost."""
    table = Table(title=title, title_justify="left")
    for name in ("step", "op", "dev dim", "tensor dims", "group", "volume", "ct", "cost"):
        right = name not in ("step", "op", "tensor dims")
        table.add_column(name, justify="right" if right else "left", no_wrap=True)
    steps = (
        [("prelude", op) for op in plan.prelude]
        + [("unified", op) for op in plan.ops]
        + [("epilogue", op) for op in plan.epilogue]
    )
    for step, op in steps:
        dims = "-" if op.tensor_dim is None else str(op.tensor_dim)
        if op.to_tensor_dim is not None:
            dims = f"{op.tensor_dim} -> {op.to_tensor_dim}"
        table.add_row(
            step,
            op.kind,
            str(op.device_dim),
            dims,
            str(op.group_size),
            f"{op.volume:,}",
            str(op.inter_node_groups(cluster.devices_per_node)),
            format_seconds(op.cost(cluster, dtype_bytes)),
        )
    table.caption = (
        f"total: {plan.volume:,} elements per device, "
        f"{format_bytes(plan.cost(cluster, dtype_bytes, 'volume'))}, "
        f"{format_seconds(plan.cost(cluster, dtype_bytes))}"
    )
    table.caption_justify = "left"
    return table


def _strategy_text(op_axes: tuple[str, ...], strategy) -> str:
    parts = [
        f"{as_text(axis)}={d}@{m}"
        for axis, d, m in zip(op_axes, strategy.degrees, strategy.device_map)
        if d > 1
    ]
    return " ".join(parts) or "replicated"


def strategy_table(source: Priced) -> Table:
    """One row per operator: its strategy, device matrix and the cost it adds; a search result's
    caption also says how the search went."""
    plan, rows, cost = source.plan, source.breakdown, source.cost
    model = plan.pricing.cost_model
    what = "search" if isinstance(source, SearchResult) else "saved plan"
    table = Table(
        title=f"{as_text(plan.graph.name)}: {model} {what} on "
        f"{plan.cluster.nodes} x {plan.cluster.devices_per_node} devices",
        title_justify="left",
    )
    for name in ("operator", "strategy", "device matrix"):
        table.add_column(name, no_wrap=True)
    timed = plan.pricing.counts_compute
    # With compute counted the step's columns: compute, exposed communication, step time.
    extra = ("compute", "exposed", "step") if timed else ()
    for name in ("collectives", "redistribution", *extra, "total"):
        table.add_column(name, justify="right", no_wrap=True)

    def step_cells(compute: float, exposed: float) -> list[str]:
        if not timed:
            return []
        return [format_seconds(compute), format_seconds(exposed), format_seconds(compute + exposed)]

    for row in rows:
        op = plan.graph.op(row.name)
        table.add_row(
            as_text(row.name),
            _strategy_text(op.partitionable, row.strategy) + (" FSDP" if _sharded(row) else ""),
            str(row.strategy.device_matrix),
            format_cost(row.intra_cost, model),
            format_cost(row.incoming_cost, model),
            *step_cells(row.compute, row.exposed),
            format_cost(row.total, model),
        )
    intra = sum(r.intra_cost for r in rows)
    incoming = sum(r.incoming_cost for r in rows)
    step = source.step
    table.add_section()
    table.add_row(
        "total",
        "",
        "",
        format_cost(intra, model),
        format_cost(incoming, model),
        *step_cells(step.compute, step.exposed),
        format_cost(cost, model),
    )
    pricing = plan.pricing
    kind = "training step" if pricing.step == "training" else "forward step (the paper)"
    table.caption = (
        "strategy: axis=degree@device dim (0 innermost); "
        f"{kind}, {pricing.planner} planner{', ZeRO' if pricing.zero else ''}"
    )
    sharded = sum(map(_sharded, rows))
    if sharded:
        table.caption += f"; FSDP: {sharded} operator(s) store their parameters sharded"
    if timed:
        table.caption += (
            f"; step time {format_seconds(step.step_time)}: compute "
            f"{format_seconds(step.compute)}, communication {format_seconds(step.communication)}"
            f" of which {format_seconds(step.exposed)} exposed (total: what the search minimises)"
        )
    if isinstance(source, SearchResult):
        table.caption += _search_caption(source)
    table.caption_justify = "left"
    return table


def _sharded(row: OpCost) -> bool:
    """Whether an operator stores its parameters sharded (FSDP): it gathers them."""
    return any(c.reason in GATHERS for c, _ in row.collectives)


def experts_text(plan: Plan) -> str | None:
    """One line on the plan's expert parallelism (docs/moe.md), or None without experts: per
    distinct split of its expert operators, the expert-parallel degree and where its group sits,
    the data-parallel degree around it and the tensor-parallel degree inside each expert."""
    splits = expert_splits(plan)
    if not splits:
        return None
    parts = [
        f"expert-parallel {s.expert} ({s.level}), data-parallel {s.data}, tensor-parallel "
        f"{s.tensor} in {n} expert operator{'s' if n > 1 else ''}"
        for s, n in sorted(splits.items(), key=lambda item: -item[1])
    ]
    return "experts: " + "; ".join(parts)


def _search_caption(result: SearchResult) -> str:
    """How the search went: status, size, time and memory."""
    layers = result.plan.graph.layers
    return (
        f"; {result.status}, gap {gap_text(result.gap)}, {result.num_aux_edges:,} auxiliary edges; "
        f"{result.ilp.eliminated} of {len(result.plan.graph.ops)} operators decided by exact "
        f"reductions, {ilp_text(result)}; search {result.timings['total']:.3f} s; "
        f"memory {format_bytes(result.memory_per_device)} per device"
        + (f" for {layers} layers" if layers > 1 else "")
    )


def gap_text(gap: float) -> str:
    """SCIP's relative gap, or "unknown" before it has a bound."""
    return f"{gap:.2%}" if math.isfinite(gap) else "unknown"


def ilp_text(result: SearchResult) -> str:
    """What SCIP was handed, in words."""
    ilp = result.ilp
    if ilp.operators == 0:
        return "no ILP left for SCIP"
    return (
        f"SCIP: {ilp.operators} operators, {ilp.binaries:,} binaries + "
        f"{ilp.continuous:,} continuous, {ilp.constraints:,} constraints"
    )


def collectives_table(source: Priced) -> Table:
    """Every collective of the chosen assignment: intra-operator all_reduces and the ops of each
    incoming redistribution, with ct and cost, so a reader sees where the time goes."""
    plan, rows = source.plan, source.breakdown
    model = plan.pricing.cost_model
    cluster = plan.cluster
    table = Table(title="Collectives", title_justify="left")
    for name in ("operator", "tensor", "why", "collective"):
        table.add_column(name)
    for name in ("group", "ct", "cost"):
        table.add_column(name, justify="right")
    for row in rows:
        for c, cost in row.collectives:
            unused = [k for k in range(len(c.layout.device_matrix)) if k not in c.layout.tensor_map]
            group = 1
            for k in unused:
                group *= c.layout.device_dim_size(k)
            ct = inter_node_groups(c.layout, "all_reduce", cluster.devices_per_node)
            table.add_row(
                as_text(row.name),
                as_text(c.tensor),
                c.reason,
                c.kind,
                str(group),
                str(ct),
                format_cost(cost, model),
            )
        for inc in row.incoming:
            dtype = plan.graph.tensors[inc.edge.tensor].dtype_bytes
            # The training step also sends the gradient back to the producer.
            steps = [(inc.redistribution, f"from {inc.edge.producer}")]
            if inc.backward is not None:
                steps.append((inc.backward, f"gradient to {inc.edge.producer}"))
            for redistribution, why in steps:
                for op in redistribution.all_ops:
                    if op.kind == "slice":
                        continue
                    table.add_row(
                        as_text(row.name),
                        as_text(inc.edge.tensor),
                        as_text(why),
                        op.kind,
                        str(op.group_size),
                        str(op.inter_node_groups(cluster.devices_per_node)),
                        format_cost(op.cost(cluster, dtype, model), model),
                    )
    return table


def comparison_table(comparison: Comparison) -> Table:
    """Both searches priced under the topology model."""
    topo, vol = comparison.topology, comparison.volume
    table = Table(
        title="Topology-aware vs volume-based search (both priced under the topology model)",
        title_justify="left",
    )
    for name in ("search", "topology cost", "volume (bytes/device)", "search time"):
        table.add_column(name, justify="left" if name == "search" else "right")
    table.add_row(
        "topology-aware",
        format_seconds(topo.cost),
        format_bytes(comparison.topology_under_volume),
        f"{topo.timings['total']:.3f} s",
    )
    table.add_row(
        "volume-based",
        format_seconds(comparison.volume_under_topology),
        format_bytes(vol.cost),
        f"{vol.timings['total']:.3f} s",
    )
    # With compute counted the topology model prices the step, else its communication.
    what = "time per step" if topo.plan.pricing.counts_compute else "communication time"
    table.caption = f"saving: {comparison.saving:.1f}% less {what}"
    table.caption_justify = "left"
    return table


def layout_dict(layout: Layout) -> dict[str, Any]:
    """A layout as JSON-ready data."""
    return {
        "shape": layout.shape,
        "device_matrix": layout.device_matrix,
        "tensor_map": layout.tensor_map,
        "partial": layout.partial,
    }


def redistribution_dict(
    plan: Redistribution, cluster: Cluster, dtype_bytes: float
) -> dict[str, Any]:
    """A redistribution as JSON-ready data: its cost on ``cluster`` and its ops."""
    return {"cost": plan.cost(cluster, dtype_bytes), "ops": _ops_dict(plan)}


def _ops_dict(plan: Redistribution) -> list[dict[str, Any]]:
    return [
        {
            "kind": o.kind,
            "device_dim": o.device_dim,
            "tensor_dim": o.tensor_dim,
            "to_tensor_dim": o.to_tensor_dim,
            "group_size": o.group_size,
            "volume": o.volume,
        }
        for o in plan.all_ops
    ]


def result_dict(source: Priced) -> dict[str, Any]:
    """A search result or a saved plan as plain JSON-ready data: strategies, costs and the full
    breakdown; a search result's also says how the search went."""
    plan, rows, cost = source.plan, source.breakdown, source.cost
    ops = []
    for row in rows:
        op = plan.graph.op(row.name)
        ops.append(
            {
                "name": row.name,
                "axes": list(op.partitionable),
                "degrees": row.strategy.degrees,
                "device_map": row.strategy.device_map,
                "device_matrix": row.strategy.device_matrix,
                "intra_cost": row.intra_cost,
                "incoming_cost": row.incoming_cost,
                "forward_compute": row.forward_compute,
                "backward_compute": row.backward_compute,
                "communication": row.communication,
                "exposed": row.exposed,
                "step_time": row.step_time,
                "total": row.total,
                "sharded": _sharded(row),
                "collectives": [
                    {
                        "tensor": c.tensor,
                        "reason": c.reason,
                        "kind": c.kind,
                        "parameter": c.parameter,
                        "cost": cost,
                        "layout": {
                            "shape": c.layout.shape,
                            "device_matrix": c.layout.device_matrix,
                            "tensor_map": c.layout.tensor_map,
                        },
                    }
                    for c, cost in row.collectives
                ],
                "incoming": [
                    {
                        "from": inc.edge.producer,
                        "tensor": inc.edge.tensor,
                        "cost": inc.cost,
                        "ops": _ops_dict(inc.redistribution),
                        "backward_cost": inc.backward_cost,
                        "backward_ops": None if inc.backward is None else _ops_dict(inc.backward),
                    }
                    for inc in row.incoming
                ],
            }
        )
    c = plan.cluster
    out = {
        "graph": plan.graph.name,
        "layers": plan.graph.layers,
        "cluster": {
            "nodes": c.nodes,
            "devices_per_node": c.devices_per_node,
            "intra_bandwidth": c.intra_bandwidth,
            "inter_bandwidth": c.inter_bandwidth,
            "device": c.device.name,
            "device_memory": c.device_memory,
        },
        "cost_model": plan.pricing.cost_model,
        "step": plan.pricing.step,
        "planner": plan.pricing.planner,
        "zero": plan.pricing.zero,
        "fsdp": plan.pricing.fsdp,
        "compute": plan.pricing.counts_compute,
        "gradient_bytes": plan.pricing.gradient_bytes,
        "cost": cost,
        "step_time": source.step.step_time,
        "compute_time": source.step.compute,
        "communication": source.step.communication,
        "exposed": source.step.exposed,
        "operators": ops,
    }
    splits = expert_splits(plan)
    if splits:
        out["experts"] = [
            {
                "expert_parallel": s.expert,
                "level": s.level,
                "data_parallel": s.data,
                "tensor_parallel": s.tensor,
                "operators": n,
            }
            for s, n in splits.items()
        ]
    if not isinstance(source, SearchResult):
        return out
    result = source
    return {
        **out,
        "status": result.status,
        # Unknown (no bound yet when a time limit stopped SCIP) is null: JSON has no Infinity.
        "gap": result.gap if math.isfinite(result.gap) else None,
        "num_aux_edges": result.num_aux_edges,
        "ilp": {
            "binaries": result.ilp.binaries,
            "continuous": result.ilp.continuous,
            "constraints": result.ilp.constraints,
            "operators": result.ilp.operators,
            "eliminated": result.ilp.eliminated,
        },
        "memory_per_device": result.memory_per_device,
        "timings": result.timings,
    }


def stages_table(plan: Plan, step_time: float) -> Table:
    """A pipelined plan's stages, one row each: its operators, its devices, its operators' most
    common split degrees (tensor, data: the degrees of its first contraction), its times per
    microbatch, its send and its memory; the caption gives the pipeline and the step time."""
    p = plan.pipeline
    assert p is not None
    copies = f"{p.replicas} cop{'y' if p.replicas == 1 else 'ies'}"
    table = Table(
        title=f"{as_text(plan.graph.name)}: {p.stages} stage group(s) x {copies} on "
        f"{plan.cluster.nodes} x {plan.cluster.devices_per_node} devices",
        title_justify="left",
        caption=f"{p.schedule}, {p.microbatches} microbatches"
        + (f", {p.chunks} chunks per group" if p.chunks and p.chunks > 1 else "")
        + f"; step time {format_seconds(step_time)}",
        caption_justify="left",
    )
    for name in (
        "stage",
        "operators",
        "devices",
        "ranks",
        "forward",
        "backward",
        "send",
        "memory",
    ):
        table.add_column(name, justify="left" if name in ("operators", "ranks") else "right")
    for s in plan.stages:
        first, last = s.operators[0], s.operators[-1]
        ops = first if first == last else f"{first} .. {last} ({len(s.operators)})"
        where = f"{s.cluster.nodes} node(s)" if s.cluster.nodes > 1 else f"{s.devices} of a node"
        table.add_row(
            str(s.index),
            as_text(ops),
            f"{s.devices} ({where})",
            f"{s.first_device}..{s.first_device + s.devices - 1}",
            format_seconds(s.forward),
            format_seconds(s.backward),
            format_seconds(s.send),
            f"{format_bytes(s.memory)} ({s.in_flight:g} in flight)",
        )
    return table


def pipeline_dict(plan: Plan, step_time: float) -> dict[str, Any]:
    """A pipelined plan's pipeline, stages and step time as a JSON object."""
    assert plan.pipeline is not None
    return {
        "pipeline": plan.pipeline.to_dict(),
        "step_time": step_time,
        "stages": [s.to_dict() for s in plan.stages],
    }
