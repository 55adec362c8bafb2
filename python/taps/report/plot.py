"""A figure of a plan (``taps search --plot plan.png``; matplotlib, the extra ``taps[plot]``).

One row per operator, in topological order. Left: its strategy, the device matrix drawn as
segments from the innermost device dim outwards, each as wide as log2 of its size and labelled
with the axis it splits and the degree; segments right of the dashed line span nodes. Right: the
communication the operator adds, split into intra-operator collectives inside a node, collectives
across nodes, and the redistribution of its inputs."""

from __future__ import annotations

import math
import os
from typing import Any

from taps._core import inter_node_groups
from taps._support.extras import require
from taps.errors import ArgumentError
from taps.plan.plan import Plan
from taps.report.priced import Priced
from taps.search.evaluate import OpCost

#: Inches: figure width, height per operator and for title, axes and legends.
WIDTH = 12.0
ROW_HEIGHT = 0.32
MARGIN_HEIGHT = 1.6
#: Pixels per inch of the saved figures.
DPI = 90

_PURPOSE = "drawing figures"
_COST_COLORS = ("tab:green", "tab:red", "tab:blue")
_COST_LABELS = ("collectives inside a node", "collectives across nodes", "redistribution")


def new_figure(width: float, height: float) -> Any:
    """A matplotlib figure of ``width`` x ``height`` inches on the Agg canvas (no display)."""
    agg = require("matplotlib.backends.backend_agg", "plot", _PURPOSE)
    figure = require("matplotlib.figure", "plot", _PURPOSE)
    fig = figure.Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    agg.FigureCanvasAgg(fig)
    return fig


def check_available(path: str | os.PathLike[str] | None = None) -> None:
    """Raise :class:`~taps.errors.MissingExtraError` now if figures cannot be drawn, or an
    :class:`~taps.errors.ArgumentError` if ``path``'s suffix names no format matplotlib writes,
    so a long search does not fail at its end."""
    require("matplotlib", "plot", _PURPOSE)
    if path is None:
        return
    agg = require("matplotlib.backends.backend_agg", "plot", _PURPOSE)
    formats = agg.FigureCanvasAgg.get_supported_filetypes()
    suffix = os.path.splitext(os.fspath(path))[1].lstrip(".").lower()
    if suffix not in formats:
        raise ArgumentError(
            f"a figure's file must end in a format matplotlib writes (.png, .svg, .pdf, ...), "
            f"got {os.fspath(path)!r}"
        )


def _plain_text() -> Any:
    """A context in which the figure's texts are drawn as written: a ``$`` in a name is not
    TeX (matplotlib's mathtext would parse it, and fail on most)."""
    return require("matplotlib", "plot", _PURPOSE).rc_context({"text.parse_math": False})


def figure_size(num_operators: int) -> tuple[int, int]:
    """The (width, height) in pixels of the figure of a plan with ``num_operators`` rows."""
    return round(WIDTH * DPI), round((MARGIN_HEIGHT + ROW_HEIGHT * num_operators) * DPI)


def cost_split(source: Priced) -> list[tuple[float, float, float]]:
    """Per operator row of the breakdown: the cost of its collectives inside a node, of those
    across nodes, and of its incoming redistributions (they add up to its total)."""
    dpn = source.plan.cluster.devices_per_node
    out = []
    for row in source.breakdown:
        inside = across = 0.0
        for c, cost in row.collectives:
            if inter_node_groups(c.layout, "all_reduce", dpn):  # the only intra-operator kind
                across += cost
            else:
                inside += cost
        out.append((inside, across, row.incoming_cost))
    return out


def plot_plan(source: Priced, path: str | os.PathLike[str]) -> None:
    """Draw :func:`plan_figure` of ``source`` into ``path`` (PNG, or any format matplotlib knows
    by the suffix); the size in pixels is :func:`figure_size`."""
    check_available(path)
    with _plain_text():
        plan_figure(source).savefig(os.fspath(path), dpi=DPI)


def plan_figure(source: Priced) -> Any:
    """The figure of a priced plan: the strategies on its first axes, the costs on its second."""
    plan, rows = source.plan, source.breakdown
    width, height = figure_size(len(rows))
    fig = new_figure(width / DPI, height / DPI)
    strategy_ax, cost_ax = fig.subplots(1, 2, sharey=True, width_ratios=(1, 1))
    cluster = plan.cluster
    _draw_strategies(strategy_ax, plan, rows)
    costs = cost_split(source)
    topology = plan.pricing.cost_model == "topology"
    scale, unit = (1e3, "ms") if topology else (2.0**-20, "MiB")
    left = [0.0] * len(rows)
    for k, (color, label) in enumerate(zip(_COST_COLORS, _COST_LABELS)):
        values = [c[k] * scale for c in costs]
        cost_ax.barh(range(len(rows)), values, left=left, color=color, label=label, height=0.7)
        left = [a + b for a, b in zip(left, values)]
    cost_ax.set_xlabel(
        f"communication per step ({unit})" if topology else f"bytes per device ({unit})",
        fontsize=8,
    )
    cost_ax.legend(fontsize=7, loc="best")
    cost_ax.tick_params(labelsize=8)
    step = source.step
    total = f"{step.communication * scale:.4g} {unit} communication"
    if plan.pricing.counts_compute:
        total = f"step {step.step_time * scale:.4g} {unit} ({total})"
    fig.suptitle(
        f"{plan.graph.name}: {plan.pricing.cost_model} plan on {cluster.nodes} x "
        f"{cluster.devices_per_node} devices, {total} per step",
        fontsize=10,
    )
    return fig


def _draw_strategies(ax: Any, plan: Plan, rows: list[OpCost]) -> None:
    """Per operator, its device dims innermost first, each labelled with the axis it splits."""
    palette = require("matplotlib", "plot", _PURPOSE).colormaps["Set3"]
    colors: dict[str, Any] = {}
    for y, row in enumerate(rows):
        axes = plan.graph.op(row.name).partitionable
        split = {
            m: (axis, d)
            for axis, d, m in zip(axes, row.strategy.degrees, row.strategy.device_map)
            if d > 1
        }
        x = 0.0
        for dim in sorted(split):  # 0 is the innermost device dim
            axis, degree = split[dim]
            color = colors.setdefault(axis, palette(len(colors) % 12))
            w = math.log2(degree)
            ax.barh(y, w, left=x, height=0.7, color=color, edgecolor="white")
            ax.text(x + w / 2, y, f"{axis}\u00d7{degree}", ha="center", va="center", fontsize=7)
            x += w
        if not split:
            ax.text(0.1, y, "replicated", va="center", fontsize=7)
    n = math.log2(plan.cluster.num_devices)
    inside = math.log2(plan.cluster.devices_per_node)
    ax.axvline(inside, color="black", linestyle="--", linewidth=1, label="node boundary")
    ax.set_xlim(0, max(n, 1))
    ax.set_xticks(range(int(max(n, 1)) + 1))
    ax.set_yticks(range(len(rows)), [r.name for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("device dims, innermost first (width: log2 of the size)", fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    ax.tick_params(labelsize=8)


def plot_stages(plan: Plan, path: str | os.PathLike[str]) -> None:
    """Draw a pipelined plan's stages into ``path``: per stage a bar of its forward and backward
    per microbatch and its send, labelled with its operators and devices, and its memory."""
    check_available(path)
    with _plain_text():
        _stages_figure(plan).savefig(os.fspath(path), dpi=DPI)


def _stages_figure(plan: Plan) -> Any:
    """The figure :func:`plot_stages` draws."""
    stages = plan.stages
    fig = new_figure(WIDTH, MARGIN_HEIGHT + 0.45 * len(stages))
    time_ax, memory_ax = fig.subplots(1, 2, sharey=True, width_ratios=(2, 1))
    ys = range(len(stages))
    forward = [s.forward * 1e3 for s in stages]
    backward = [s.backward * 1e3 for s in stages]
    send = [s.send * 1e3 for s in stages]
    time_ax.barh(ys, forward, color="tab:blue", label="forward", height=0.7)
    time_ax.barh(ys, backward, left=forward, color="tab:orange", label="backward", height=0.7)
    left = [f + b for f, b in zip(forward, backward)]
    time_ax.barh(ys, send, left=left, color="tab:red", label="send", height=0.7)
    labels = [
        f"{s.index}: {s.operators[0]}..{s.operators[-1]} on {s.first_device}.."
        f"{s.first_device + s.devices - 1}"
        for s in stages
    ]
    time_ax.set_yticks(list(ys), labels)
    time_ax.invert_yaxis()
    time_ax.set_xlabel("ms per microbatch", fontsize=8)
    time_ax.legend(fontsize=7, loc="best")
    time_ax.tick_params(labelsize=7)
    memory_ax.barh(ys, [s.memory / 2**30 for s in stages], color="tab:green", height=0.7)
    limit = plan.cluster.device_memory
    if limit is not None:
        memory_ax.axvline(limit / 2**30, color="black", linestyle="--", linewidth=1)
    memory_ax.set_xlabel("GiB per device (dashed: the limit)", fontsize=8)
    memory_ax.tick_params(labelsize=7)
    p = plan.pipeline
    assert p is not None
    fig.suptitle(
        f"{plan.graph.name}: {p.schedule}, {p.stages} group(s) x {p.replicas} copies, "
        f"{p.microbatches} microbatches",
        fontsize=10,
    )
    return fig
