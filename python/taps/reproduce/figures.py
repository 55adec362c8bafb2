"""The reproduction's figures (matplotlib, an optional extra: ``pip install 'taps[plot]'``)."""

from __future__ import annotations

from pathlib import Path

from taps.report.plot import check_available, new_figure
from taps.reproduce.cases import TOLERANCE
from taps.reproduce.run import Row

__all__ = ["check_available", "plot_comparison", "plot_ratio"]

_VOLUME_COLOR = "tab:blue"
_TOPOLOGY_COLOR = "tab:orange"


def plot_comparison(rows: list[Row], path: Path) -> None:
    """Per model, per node count: topology-aware and volume-based cost, whiskers over the ties."""
    comparison = [r for r in rows if r.sweep == "comparison"]
    model_names = list(dict.fromkeys(r.model for r in comparison))
    cols = 2 if len(model_names) > 1 else 1
    nrows = (len(model_names) + cols - 1) // cols
    fig = new_figure(5.2 * cols, 3.4 * nrows)
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    for ax, model in zip(axes, model_names):
        mine = [r for r in comparison if r.model == model]
        xs = range(len(mine))
        returned = [r.volume_cost_returned * 1e3 for r in mine]
        # Clamped at 0: float noise between equal costs must not make a whisker negative.
        whiskers = [
            [max(0.0, r.volume_cost_returned - r.volume_cost_best_tie) * 1e3 for r in mine],
            [max(0.0, r.volume_cost_worst_tie - r.volume_cost_returned) * 1e3 for r in mine],
        ]
        ax.bar(
            [x - 0.2 for x in xs],
            returned,
            0.4,
            yerr=whiskers,
            capsize=3,
            color=_VOLUME_COLOR,
            label="volume-based (whiskers: best to worst tie)",
        )
        ax.bar(
            [x + 0.2 for x in xs],
            [r.topology_cost * 1e3 for r in mine],
            0.4,
            color=_TOPOLOGY_COLOR,
            label="topology-aware",
        )
        for x, r in zip(xs, mine):
            if r.nodes > 1:
                ax.annotate(
                    f"{-round(r.saving_vs_best_tie) or 0}%",
                    (x + 0.2, r.topology_cost * 1e3),
                    textcoords="offset points",
                    xytext=(0, 2),
                    ha="center",
                    fontsize=7,
                )
        ax.set_xticks(list(xs), [f"{r.nodes} x {r.devices_per_node}" for r in mine])
        ax.set_title(f"{model} (batch {mine[0].batch})", fontsize=10)
        ax.set_xlabel("nodes x devices per node", fontsize=8)
        ax.set_ylabel("communication per step (ms)", fontsize=8)
        ax.tick_params(labelsize=8)
    for ax in axes[len(model_names) :]:
        ax.set_axis_off()
    # Outside the axes: inside, it hides the tallest whiskers.
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=2, fontsize=8)
    fig.suptitle(
        "Topology-aware vs volume-based search, both priced under the topology model "
        "(labels: saving vs best tie)",
        fontsize=10,
    )
    fig.savefig(path)


_SWEEP_COLORS = {
    "comparison": "tab:blue",
    "bandwidth": "tab:green",
    "devices_per_node": "tab:purple",
    "batch": "tab:red",
}
_MARKERS = ("o", "s", "^", "D", "v", "P")


def plot_ratio(rows: list[Row], path: Path) -> None:
    """One point per run: volume ratio against cost ratio, with the lines x = 1 and y = 1."""
    fig = new_figure(8.4, 4.6)
    ax = fig.subplots()
    model_names = list(dict.fromkeys(r.model for r in rows))
    for sweep, color in _SWEEP_COLORS.items():
        for model, marker in zip(model_names, _MARKERS):
            mine = [r for r in rows if r.sweep == sweep and r.model == model]
            if mine:
                ax.scatter(
                    [r.volume_ratio for r in mine],
                    [r.cost_ratio for r in mine],
                    s=22,
                    c=color,
                    marker=marker,
                    alpha=0.75,
                    label=f"{sweep}: {model}",
                )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xlabel("volume ratio (topology-aware / volume-based bytes)", fontsize=9)
    ax.set_ylabel("cost ratio (topology-aware / volume-based, best tie)", fontsize=9)
    above = sum(r.cost_ratio > 1 + TOLERANCE for r in rows)
    below = sum(r.cost_ratio < 1 - TOLERANCE for r in rows)
    ax.set_title(f"{len(rows)} runs: {below} below y = 1, {above} above", fontsize=10)
    ax.tick_params(labelsize=8)
    fig.legend(loc="outside right upper", fontsize=7)
    fig.savefig(path)
