"""Running the cases: both searches and the lexicographic tie solves per case, the median search
times, with a progress bar."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from taps import models
from taps._core import Cluster
from taps.graph import Graph
from taps.plan.pricing import Pricing
from taps.reproduce.cases import DEVICES_PER_NODE, Case, TimingCase, paper_cluster
from taps.search.searching import STAGES, SearchResult, search
from taps.search.tables import build_tables
from taps.solve.pipeline import IlpOptions, solve


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
    #: The full model (:data:`FULL_MODEL`, comparison runs only; None elsewhere), seconds: its
    #: own optimum, and the paper-model topology-aware plan priced under it.
    full_cost: float | None = None
    full_cost_of_paper_plan: float | None = None
    full_search_time: float | None = None

    @property
    def saving_vs_returned(self) -> float:
        return _saving(self.topology_cost, self.volume_cost_returned)

    @property
    def saving_vs_best_tie(self) -> float:
        return _saving(self.topology_cost, self.volume_cost_best_tie)

    @property
    def saving_vs_worst_tie(self) -> float:
        return _saving(self.topology_cost, self.volume_cost_worst_tie)

    @property
    def full_saving(self) -> float | None:
        """Percent less time, under the full model, of its optimum than of the paper's plan."""
        if self.full_cost is None or self.full_cost_of_paper_plan is None:
            return None
        return _saving(self.full_cost, self.full_cost_of_paper_plan)

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
        if self.full_search_time is not None:
            out["full_search_time"] = round(self.full_search_time, 4)
        for name in DERIVED_COLUMNS:
            out[name] = getattr(self, name)
        return out


DERIVED_COLUMNS = (
    "full_saving",
    "saving_vs_returned",
    "saving_vs_best_tie",
    "saving_vs_worst_tie",
    "volume_ratio",
    "cost_ratio",
    "cost_ratio_returned",
)
CSV_COLUMNS = tuple(f.name for f in fields(Row)) + DERIVED_COLUMNS


def _ratio(a: float, b: float) -> float:
    # Both zero: nothing to communicate either way, which is no difference.
    return 1.0 if a == b else a / b


def _saving(cost: float, baseline: float) -> float:
    """Percent less time than ``baseline``."""
    return 100.0 * (1.0 - _ratio(cost, baseline))


#: The paper's model: forward redistributions planned by Algorithm 1, gradients all_reduced at
#: the operators in the model's dtype, replicas sharing one transfer out of a node; communication
#: only (no compute).
PAPER_MODEL = Pricing(step="forward", planner="paper", compute=False, gradient_bytes=None)
#: Closer to what engines run: the training step and (on the cluster) flat replicas. Algorithm 1
#: plans the edges, as taps.search does by default: the optimal planner is tens of times slower
#: (docs/search.md#speed). Communication only, gradients in the model's dtype, as the column it
#: is compared with.
FULL_MODEL = Pricing(step="training", planner="paper", compute=False, gradient_bytes=None)


def full_cluster(cluster: Cluster) -> Cluster:
    """``cluster`` with flat replicas (every copy sends its own transfer, as NCCL and XLA do)."""
    return Cluster.hierarchy(
        cluster.levels,
        math.inf if cluster.device_memory is None else cluster.device_memory,
        "flat",
        cluster.device.name,
    )


def run_case(case: Case) -> Row:
    """Both searches and both lexicographic solves, on one set of tables per cost model; on the
    comparison runs, the search under the full model too."""
    graph, cluster = case.graph(), case.cluster()
    t0 = time.perf_counter()
    topo_tables = build_tables(graph, cluster, PAPER_MODEL)
    topo = solve(topo_tables)
    t1 = time.perf_counter()
    vol_tables = build_tables(graph, cluster, replace(PAPER_MODEL, cost_model="volume"))
    vol = solve(vol_tables)
    t2 = time.perf_counter()
    best = solve(vol_tables, tie_break=(topo_tables, "min"))
    worst = solve(vol_tables, tie_break=(topo_tables, "max"))
    t3 = time.perf_counter()
    full: dict[str, float] = {}
    if case.sweep == "comparison":
        full_tables = build_tables(graph, full_cluster(cluster), FULL_MODEL)
        # Both tables list every operator's candidates in one order, so choices carry over.
        full = {
            "full_cost": full_tables.evaluate(solve(full_tables).choice),
            "full_cost_of_paper_plan": full_tables.evaluate(topo.choice),
            "full_search_time": time.perf_counter() - t3,
        }
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
        **full,
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


def median_search(
    graph: Graph, cluster: Cluster, options: IlpOptions, repeat: int = 3
) -> SearchResult:
    """``taps.search`` as a user runs it: one warm-up, then the run of median end-to-end time
    among ``repeat``."""
    search(graph, cluster, PAPER_MODEL, options=options)
    runs = [search(graph, cluster, PAPER_MODEL, options=options) for _ in range(repeat)]
    return sorted(runs, key=lambda r: r.timings["total"])[len(runs) // 2]


def time_search(case: TimingCase, repeat: int = 3) -> TimingRow:
    """The median search of a case, and the median without the exact reductions."""
    batch = models.default_batch(case.model)
    graph = models.by_name(case.model, batch)
    cluster = paper_cluster(case.nodes)
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
