"""``taps reproduce``: the paper's evaluation in one command.

Runs three experiments and writes into one directory:

- the comparison (the paper's figure "comparison"): topology-aware against volume-based search,
  both priced under the topology model. The volume-based search has ties (assignments that move
  the same bytes) whose topology costs differ, so its cost is given three ways: the assignment
  the search returns, and the best and the worst tie, found by lexicographic solves;
- the ratio scatter (the paper's figure "ratio") over every (model, topology), with sweeps of the
  inter/intra bandwidth ratio, of the devices per node and of the Megatron batch;
- the search-time table (the paper's table "search runtime"), stage by stage.

Files: ``results.csv`` (one row per model and topology), ``search_times.csv``, ``report.md``,
``comparison.png`` and ``ratio.png``. Costs are deterministic; times are wall-clock.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from taps import models
from taps._core import Cluster, GraphError, TapsError
from taps.costs import build_tables
from taps.graph import Graph
from taps.ilp import IlpOptions, solve
from taps.search import STAGES, SearchResult, search

INTRA_BANDWIDTH = 60e9
INTER_BANDWIDTH = 6e9
DEVICES_PER_NODE = 8
#: The default of :func:`taps.models.alexnet` (the paper gives no batch size).
ALEXNET_BATCH = 128
#: The models of the comparison and the sweeps (the 1T layer runs on one node only).
MAIN_MODELS = ("alexnet", "megatron-1.7B", "megatron-3.6B")
#: Inter/intra bandwidth ratios of the bandwidth sweep (the comparison runs at 1/10).
BANDWIDTH_RATIOS = (1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64)
#: Devices per node of the devices sweep (the comparison runs at 8).
SWEEP_DEVICES_PER_NODE = (4, 16)
#: Megatron batches of the batch sweep (the comparison runs at the global batch).
MEGATRON_BATCHES = (1, 4, 16)
#: Relative float noise allowed between costs that are equal in exact arithmetic.
TOLERANCE = 1e-9


def _megatron_key(model: str) -> str:
    name = model[len("megatron-") :]
    return "1008.0B" if name.upper() == "1T" else name


def default_batch(model: str) -> int:
    """The batch the experiments use: AlexNet 128, Megatron its global batch."""
    if model == "alexnet":
        return ALEXNET_BATCH
    if model.startswith("megatron-") and _megatron_key(model) in models.MEGATRON_CONFIGS:
        return models.MEGATRON_CONFIGS[_megatron_key(model)].global_batch
    raise GraphError(f"unknown model {model!r}: expected alexnet or megatron-NAME")


@dataclass(frozen=True)
class Case:
    """One (model, topology) of an experiment; ``sweep`` names the experiment."""

    sweep: str
    model: str
    batch: int
    nodes: int
    devices_per_node: int = DEVICES_PER_NODE
    intra_bandwidth: float = INTRA_BANDWIDTH
    inter_bandwidth: float = INTER_BANDWIDTH

    def cluster(self) -> Cluster:
        return Cluster(
            self.nodes, self.devices_per_node, self.intra_bandwidth, self.inter_bandwidth
        )

    def graph(self) -> Graph:
        return models.by_name(self.model, self.batch)

    @property
    def label(self) -> str:
        ratio = self.inter_bandwidth / self.intra_bandwidth
        return (
            f"{self.sweep}: {self.model} (batch {self.batch}) on {self.nodes} x "
            f"{self.devices_per_node}, inter/intra 1/{1 / ratio:g}"
        )


def _case(
    sweep: str,
    model: str,
    nodes: int,
    batch: int | None = None,
    devices_per_node: int = DEVICES_PER_NODE,
    inter_bandwidth: float = INTER_BANDWIDTH,
) -> Case:
    return Case(
        sweep,
        model,
        default_batch(model) if batch is None else batch,
        nodes,
        devices_per_node,
        INTRA_BANDWIDTH,
        inter_bandwidth,
    )


def experiment_cases(quick: bool = False) -> list[Case]:
    """Every (model, topology) of the three experiments; ``quick`` keeps a few small ones."""
    main_models = ("alexnet", "megatron-1.7B") if quick else MAIN_MODELS
    out = []
    for model in main_models:
        nodes = (1, 2) if quick else (1, 2, 4, 8, 16) if model == "alexnet" else (1, 2, 4, 8)
        out += [_case("comparison", model, n) for n in nodes]
    out.append(_case("comparison", "megatron-1T", 1))
    sweep_models = ("alexnet",) if quick else MAIN_MODELS
    sweep_nodes = (2,) if quick else (2, 4, 8)
    ratios = (BANDWIDTH_RATIOS[0], BANDWIDTH_RATIOS[-1]) if quick else BANDWIDTH_RATIOS
    for model in sweep_models:
        for n in sweep_nodes:
            out += [
                _case("bandwidth", model, n, inter_bandwidth=INTRA_BANDWIDTH * r) for r in ratios
            ]
    per_node = SWEEP_DEVICES_PER_NODE[:1] if quick else SWEEP_DEVICES_PER_NODE
    for model in sweep_models:
        for n in sweep_nodes:
            out += [_case("devices_per_node", model, n, devices_per_node=d) for d in per_node]
    batch_models = ("megatron-1.7B",) if quick else MAIN_MODELS[1:]
    batches = MEGATRON_BATCHES[1:2] if quick else MEGATRON_BATCHES
    for model in batch_models:
        for n in sweep_nodes:
            out += [_case("batch", model, n, batch=b) for b in batches]
    return out


@dataclass(frozen=True)
class Row:
    """One line of ``results.csv``: costs in seconds under the topology model, volumes in bytes per
    device, times in seconds of wall clock."""

    sweep: str
    model: str
    batch: int
    nodes: int
    devices_per_node: int
    devices: int
    intra_bandwidth: float
    inter_bandwidth: float
    topology_cost: float
    volume_cost_returned: float
    volume_cost_best_tie: float
    volume_cost_worst_tie: float
    #: Bytes per device that the topology-aware and the volume-based result move.
    topology_volume: float
    volume_volume: float
    operators: int
    #: The paper's |E_A|.
    aux_edges: int
    #: The ILP of the topology-aware search (after the exact reductions) and of a tie solve.
    ilp_operators: int
    ilp_eliminated: int
    ilp_variables: int
    ilp_constraints: int
    tie_ilp_variables: int
    tie_ilp_constraints: int
    topology_search_time: float
    volume_search_time: float
    #: Both lexicographic solves, on the tables of the two searches.
    tie_solve_time: float

    @property
    def reduction_vs_returned(self) -> float:
        return _reduction(self.topology_cost, self.volume_cost_returned)

    @property
    def reduction_vs_best_tie(self) -> float:
        return _reduction(self.topology_cost, self.volume_cost_best_tie)

    @property
    def reduction_vs_worst_tie(self) -> float:
        return _reduction(self.topology_cost, self.volume_cost_worst_tie)

    @property
    def volume_ratio(self) -> float:
        """The ratio figure's x: how many more bytes the topology-aware result moves."""
        return _ratio(self.topology_volume, self.volume_volume)

    @property
    def cost_ratio(self) -> float:
        """The ratio figure's y: topology-aware cost over the best volume-optimal tie's."""
        return _ratio(self.topology_cost, self.volume_cost_best_tie)

    @property
    def cost_ratio_returned(self) -> float:
        return _ratio(self.topology_cost, self.volume_cost_returned)

    def csv_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name in ("topology_search_time", "volume_search_time", "tie_solve_time"):
            out[name] = round(out[name], 4)
        for name in DERIVED_COLUMNS:
            out[name] = getattr(self, name)
        return out


DERIVED_COLUMNS = (
    "reduction_vs_returned",
    "reduction_vs_best_tie",
    "reduction_vs_worst_tie",
    "volume_ratio",
    "cost_ratio",
    "cost_ratio_returned",
)
CSV_COLUMNS = tuple(f.name for f in fields(Row)) + DERIVED_COLUMNS


def _ratio(a: float, b: float) -> float:
    # Both zero: nothing to communicate either way, which is no difference.
    return 1.0 if a == b else a / b


def _reduction(cost: float, baseline: float) -> float:
    """Percent less time than ``baseline``."""
    return 100.0 * (1.0 - _ratio(cost, baseline))


def run_case(case: Case) -> Row:
    """Both searches and both lexicographic solves, on one set of tables per cost model."""
    graph, cluster = case.graph(), case.cluster()
    t0 = time.perf_counter()
    topo_tables = build_tables(graph, cluster, "topology")
    topo = solve(topo_tables)
    t1 = time.perf_counter()
    vol_tables = build_tables(graph, cluster, "volume")
    vol = solve(vol_tables)
    t2 = time.perf_counter()
    best = solve(vol_tables, tie_break=(topo_tables, "min"))
    worst = solve(vol_tables, tie_break=(topo_tables, "max"))
    t3 = time.perf_counter()
    return Row(
        sweep=case.sweep,
        model=case.model,
        batch=case.batch,
        nodes=case.nodes,
        devices_per_node=case.devices_per_node,
        devices=cluster.num_devices,
        intra_bandwidth=case.intra_bandwidth,
        inter_bandwidth=case.inter_bandwidth,
        topology_cost=topo_tables.evaluate(topo.choice),
        volume_cost_returned=topo_tables.evaluate(vol.choice),
        volume_cost_best_tie=topo_tables.evaluate(best.choice),
        volume_cost_worst_tie=topo_tables.evaluate(worst.choice),
        topology_volume=vol_tables.evaluate(topo.choice),
        volume_volume=vol_tables.evaluate(vol.choice),
        operators=len(graph.ops),
        aux_edges=topo_tables.num_aux_edges,
        ilp_operators=topo.size.operators,
        ilp_eliminated=topo.size.eliminated,
        ilp_variables=topo.size.variables,
        ilp_constraints=topo.size.constraints,
        tie_ilp_variables=best.size.variables,
        tie_ilp_constraints=best.size.constraints,
        topology_search_time=t1 - t0,
        volume_search_time=t2 - t1,
        tie_solve_time=t3 - t2,
    )


@dataclass(frozen=True)
class TimingCase:
    """A row of the paper's search-time table."""

    label: str
    model: str
    nodes: int
    paper_aux_edges: str
    paper_seconds: float


TIMING_CASES = (
    TimingCase("AlexNet", "alexnet", 1, "> 3e3", 0.1),
    TimingCase("AlexNet", "alexnet", 2, "> 1e4", 0.2),
    TimingCase("AlexNet", "alexnet", 8, "> 5e4", 0.8),
    TimingCase("Megatron-LM 1.7B", "megatron-1.7B", 4, "> 3e4", 0.4),
    TimingCase("Megatron-LM 3.6B", "megatron-3.6B", 4, "> 3e4", 0.4),
    TimingCase("Megatron-LM 1T", "megatron-1T", 1, "> 4e3", 0.1),
)


@dataclass(frozen=True)
class TimingRow:
    """The topology-aware search of one case, its median run of ``repeat``."""

    label: str
    model: str
    batch: int
    devices: int
    aux_edges: int
    paper_aux_edges: str
    ilp_operators: int
    ilp_eliminated: int
    ilp_variables: int
    ilp_constraints: int
    timings: dict[str, float]
    #: End to end with the whole graph handed to SCIP (no exact reductions), as the paper did.
    whole_ilp_time: float
    paper_seconds: float

    def csv_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "timings"}
        out.update({f"{s}_time": round(self.timings[s], 4) for s in STAGES})
        out["whole_ilp_time"] = round(self.whole_ilp_time, 4)
        return out


def timing_cases(quick: bool = False) -> list[TimingCase]:
    return [c for c in TIMING_CASES if not quick or c.nodes * DEVICES_PER_NODE <= 16]


def median_search(
    graph: Graph, cluster: Cluster, options: IlpOptions, repeat: int = 3
) -> SearchResult:
    """``taps.search`` as a user runs it: one warm-up, then the run of median end-to-end time
    among ``repeat``."""
    search(graph, cluster, options=options)
    runs = [search(graph, cluster, options=options) for _ in range(repeat)]
    return sorted(runs, key=lambda r: r.timings["total"])[len(runs) // 2]


def time_search(case: TimingCase, repeat: int = 3) -> TimingRow:
    """The median search of a case, and the median without the exact reductions."""
    batch = default_batch(case.model)
    graph = models.by_name(case.model, batch)
    cluster = Cluster(case.nodes, DEVICES_PER_NODE, INTRA_BANDWIDTH, INTER_BANDWIDTH)
    result = median_search(graph, cluster, IlpOptions(), repeat)
    whole = median_search(graph, cluster, IlpOptions(reduce=False), repeat)
    return TimingRow(
        label=case.label,
        model=case.model,
        batch=batch,
        devices=cluster.num_devices,
        aux_edges=result.num_aux_edges,
        paper_aux_edges=case.paper_aux_edges,
        ilp_operators=result.ilp.operators,
        ilp_eliminated=result.ilp.eliminated,
        ilp_variables=result.ilp.variables,
        ilp_constraints=result.ilp.constraints,
        timings={s: result.timings[s] for s in STAGES},
        whole_ilp_time=whole.timings["total"],
        paper_seconds=case.paper_seconds,
    )


def run(
    cases: list[Case], timings: list[TimingCase], console: Console
) -> tuple[list[Row], list[TimingRow]]:
    """Every case with a progress bar."""
    rows: list[Row] = []
    timing_rows: list[TimingRow] = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("", total=len(cases) + len(timings))
        for case in cases:
            progress.update(task, description=case.label)
            rows.append(run_case(case))
            progress.advance(task)
        for t in timings:
            progress.update(
                task, description=f"search time: {t.label} on {t.nodes * DEVICES_PER_NODE} devices"
            )
            timing_rows.append(time_search(t))
            progress.advance(task)
        progress.update(task, description="done")
    return rows, timing_rows


def _write_csv(path: Path, columns: Iterable[str], rows: Iterable[dict[str, Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        writer.writeheader()
        writer.writerows(rows)


# --- the report --------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def _pct(value: float) -> str:
    return f"{value:.1f}%"


def _table(header: list[str], lines: Iterable[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


@dataclass(frozen=True)
class Headline:
    """What the report and the command's last lines quote."""

    #: The paper's 85% case (AlexNet on 2 x 8), if it ran.
    alexnet_2x8: Row | None
    #: The multi-node comparison case with the largest reduction against the best tie.
    best: Row | None
    multi_node: int
    #: Multi-node comparison cases more than 20% faster than the best tie.
    above_20: int
    #: The largest cost ratio over every row (at most 1: never worse).
    max_ratio: float

    def lines(self) -> list[str]:
        out = []
        if self.alexnet_2x8 is not None:
            r = self.alexnet_2x8
            out.append(
                f"AlexNet on 2 x 8 (the paper's 85% case): {_pct(r.reduction_vs_best_tie)} less "
                f"time than the best volume-optimal tie, {_pct(r.reduction_vs_returned)} less "
                f"than the tie the search returns, {_pct(r.reduction_vs_worst_tie)} less than "
                "the worst"
            )
        if self.best is not None:
            b = self.best
            out.append(
                f"Largest reduction against the best tie: {_pct(b.reduction_vs_best_tie)} "
                f"({b.model} on {b.nodes} x {b.devices_per_node}); more than 20% in "
                f"{self.above_20} of {self.multi_node} multi-node comparison cases"
            )
        out.append(
            f"Topology-aware cost over volume-based cost (best tie), largest over every run: "
            f"{self.max_ratio:.6f} (never worse: at most 1)"
        )
        return out


def headline(rows: list[Row]) -> Headline:
    multi = [r for r in rows if r.sweep == "comparison" and r.nodes > 1]
    alexnet = [r for r in multi if r.model == "alexnet" and r.nodes == 2]
    return Headline(
        alexnet_2x8=alexnet[0] if alexnet else None,
        best=max(multi, key=lambda r: r.reduction_vs_best_tie) if multi else None,
        multi_node=len(multi),
        above_20=sum(r.reduction_vs_best_tie > 20 for r in multi),
        max_ratio=max(r.cost_ratio for r in rows),
    )


def _comparison_table(rows: list[Row]) -> str:
    lines = [
        [
            r.model,
            str(r.batch),
            f"{r.nodes} x {r.devices_per_node}",
            _ms(r.topology_cost),
            _ms(r.volume_cost_returned),
            _ms(r.volume_cost_best_tie),
            _ms(r.volume_cost_worst_tie),
            _pct(r.reduction_vs_returned),
            _pct(r.reduction_vs_best_tie),
            _pct(r.reduction_vs_worst_tie),
            f"{r.volume_ratio:.2f}",
        ]
        for r in rows
    ]
    header = [
        "model",
        "batch",
        "nodes x devices",
        "topology-aware (ms)",
        "volume: returned (ms)",
        "best tie (ms)",
        "worst tie (ms)",
        "reduction vs returned",
        "vs best tie",
        "vs worst tie",
        "volume ratio",
    ]
    return _table(header, lines)


def _pivot(rows: list[Row], column: Callable[[Row], float], header: str) -> str:
    """Reductions against the best tie: one line per model and node count, one column per
    ``column`` value."""
    cols = sorted({column(r) for r in rows})
    keys = list(dict.fromkeys((r.model, r.nodes) for r in rows))
    cell = {(r.model, r.nodes, column(r)): _pct(r.reduction_vs_best_tie) for r in rows}
    lines = [[f"{m}, {n}"] + [cell.get((m, n, c), "") for c in cols] for m, n in keys]
    return _table(["model, nodes"] + [f"{header}{c:g}" for c in cols], lines)


def _timing_table(rows: list[TimingRow]) -> str:
    lines = []
    for t in rows:
        ilp = (
            "none (reductions decide all)"
            if t.ilp_operators == 0
            else f"{t.ilp_operators} ops, {t.ilp_variables:,} vars, {t.ilp_constraints:,} cons"
        )
        lines.append(
            [t.label, str(t.devices), f"{t.aux_edges:,}", t.paper_aux_edges, ilp]
            + [f"{t.timings[s] * 1e3:.1f}" for s in STAGES]
            + [f"{t.whole_ilp_time * 1e3:.1f}"]
            + [f"< {t.paper_seconds * 1e3:g}"]
        )
    header = ["model", "\\|V_D\\|", "\\|E_A\\|", "paper \\|E_A\\|", "ILP for SCIP"]
    header += [f"{s} (ms)" for s in STAGES] + ["total, whole ILP (ms)", "paper (ms)"]
    return _table(header, lines)


def report(rows: list[Row], timings: list[TimingRow], quick: bool) -> str:
    """``report.md``: the setup, the three experiments and the headline."""
    comparison = [r for r in rows if r.sweep == "comparison"]
    ones = [r for r in rows if r.nodes == 1]
    batches = ", ".join(sorted({f"{r.model} {r.batch}" for r in comparison}))
    parts = [
        "# taps reproduce: the paper's evaluation",
        f"`taps reproduce{' --quick' if quick else ''}`: {len(rows)} (model, topology) runs. "
        "Every cost is seconds of communication per training step under the topology-aware "
        "model, no memory limit. Intra-node bandwidth 60 GB/s, inter-node 6 GB/s unless swept. "
        f"Batches (the paper gives none): {batches}.",
        "## Headline",
        "\n".join(f"- {line}" for line in headline(rows).lines()),
        '## Comparison (the paper\'s figure "comparison")',
        "Topology-aware search against volume-based search. The volume-based search has ties "
        "(assignments moving the same bytes) with different topology costs: *returned* is the "
        "one the volume-based search returns, *best* and *worst* tie are the least and most "
        "topology cost among all volume-optimal assignments (lexicographic solves). Bars: "
        "topology-aware (orange) and volume-based as returned (blue), whiskers from its best to "
        "its worst tie.",
        "![comparison](comparison.png)",
        _comparison_table(comparison),
        '## Ratios (the paper\'s figure "ratio")',
        f"One point per run ({len(rows)}): x = bytes per device the topology-aware result "
        "moves over those of the volume-based result, y = their topology costs (volume-based: "
        f"best tie). Largest y: {max(r.cost_ratio for r in rows):.6f}; on one node "
        f"({len(ones)} runs) y is 1 up to "
        f"{max((abs(r.cost_ratio - 1) for r in ones), default=0.0):.1e}.",
        "![ratio](ratio.png)",
    ]
    for sweep, title, column, head in (
        (
            "bandwidth",
            "Reduction against the best tie by inter/intra bandwidth ratio (1/10: the comparison):",
            lambda r: r.intra_bandwidth / r.inter_bandwidth,
            "1/",
        ),
        (
            "devices_per_node",
            "Reduction against the best tie by devices per node (8: the comparison):",
            lambda r: float(r.devices_per_node),
            "",
        ),
        (
            "batch",
            "Reduction against the best tie by Megatron batch (the largest: the comparison):",
            lambda r: float(r.batch),
            "batch ",
        ),
    ):
        swept = [r for r in rows if r.sweep == sweep]
        if swept:
            # The comparison's run of the same model and nodes is the sweep's reference column.
            keys = {(r.model, r.nodes) for r in swept}
            swept += [r for r in comparison if (r.model, r.nodes) in keys]
            parts += [title, _pivot(swept, column, head)]
    parts += [
        '## Search time (the paper\'s table "search runtime")',
        "`taps.search` (topology-aware) as a user runs it, median of 3 runs after a warm-up; "
        "|E_A| counted the paper's way (a pair of strategies per graph edge). The ILP is what "
        "is left for SCIP after the exact reductions; *whole ILP* is the search with the "
        "reductions off (SCIP solves every operator, as in the paper). Measured on "
        f"{os.cpu_count()} cores ({platform.machine()}, Python {platform.python_version()}); "
        "the paper used a 16-core i9-12900K.",
        _timing_table(timings),
    ]
    return "\n\n".join(parts) + "\n"


# --- the figures -------------------------------------------------------------------------------

_VOLUME_COLOR = "tab:blue"
_TOPOLOGY_COLOR = "tab:orange"


def _new_figure(width: float, height: float) -> Any:
    # matplotlib is imported here, not at the top: `taps plan` and `taps search` import this
    # module through the CLI and should not pay for it. The Agg canvas needs no display.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=90, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def plot_comparison(rows: list[Row], path: Path) -> None:
    """Per model, per node count: topology-aware and volume-based cost, whiskers over the ties."""
    comparison = [r for r in rows if r.sweep == "comparison"]
    model_names = list(dict.fromkeys(r.model for r in comparison))
    cols = 2 if len(model_names) > 1 else 1
    nrows = (len(model_names) + cols - 1) // cols
    fig = _new_figure(5.2 * cols, 3.4 * nrows)
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
                    f"{-round(r.reduction_vs_best_tie) or 0}%",
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
        "(labels: reduction vs best tie)",
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
    fig = _new_figure(8.4, 4.6)
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


# --- the command -------------------------------------------------------------------------------

FILES = ("results.csv", "search_times.csv", "report.md", "comparison.png", "ratio.png")


def reproduce(out: Path, quick: bool, console: Console) -> tuple[list[Row], list[TimingRow]]:
    """Run the experiments and write :data:`FILES` into ``out`` (created if missing)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TapsError(f"cannot create output directory {str(out)!r}: {e.strerror}") from None
    rows, timing_rows = run(experiment_cases(quick), timing_cases(quick), console)
    try:
        _write_csv(out / "results.csv", CSV_COLUMNS, (r.csv_dict() for r in rows))
        _write_csv(
            out / "search_times.csv",
            timing_rows[0].csv_dict().keys() if timing_rows else (),
            (t.csv_dict() for t in timing_rows),
        )
        (out / "report.md").write_text(report(rows, timing_rows, quick), encoding="utf-8")
        plot_comparison(rows, out / "comparison.png")
        plot_ratio(rows, out / "ratio.png")
    except OSError as e:
        raise TapsError(f"cannot write into {str(out)!r}: {e.strerror}") from None
    for line in headline(rows).lines():
        console.print(line)
    console.print(f"wrote {', '.join(FILES)} into {out}")
    return rows, timing_rows


def _command(args: argparse.Namespace, console: Console) -> None:
    reproduce(args.out, args.quick, console)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``taps reproduce`` to the CLI."""
    p = subparsers.add_parser(
        "reproduce",
        help="reproduce the paper's evaluation: CSV, report and figures",
        description="Run the paper's evaluation (topology-aware vs volume-based search, the "
        "ratio sweeps, the search times) and write results.csv, search_times.csv, report.md, "
        "comparison.png and ratio.png into DIR.",
    )
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    p.add_argument(
        "--quick", action="store_true", help="a few small cases only (well under a minute)"
    )
    p.set_defaults(run=_command)
