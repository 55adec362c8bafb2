"""The reproduction's text outputs: the CSV files, ``report.md`` and the headline."""

from __future__ import annotations

import csv
import os
import platform
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taps.reproduce.run import Row, TimingRow
from taps.search.searching import STAGES


def write_csv(path: Path, columns: Iterable[str], rows: Iterable[dict[str, Any]]) -> None:
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
    #: The multi-node comparison case with the largest saving against the best tie.
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
                f"AlexNet on 2 x 8 (the paper's 85% case): {_pct(r.saving_vs_best_tie)} less "
                f"time than the best volume-optimal tie, {_pct(r.saving_vs_returned)} less "
                f"than the tie the search returns, {_pct(r.saving_vs_worst_tie)} less than "
                "the worst"
            )
        if self.best is not None:
            b = self.best
            out.append(
                f"Largest saving against the best tie: {_pct(b.saving_vs_best_tie)} "
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
        best=max(multi, key=lambda r: r.saving_vs_best_tie) if multi else None,
        multi_node=len(multi),
        above_20=sum(r.saving_vs_best_tie > 20 for r in multi),
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
            _pct(r.saving_vs_returned),
            _pct(r.saving_vs_best_tie),
            _pct(r.saving_vs_worst_tie),
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
        "saving vs returned",
        "vs best tie",
        "vs worst tie",
        "volume ratio",
    ]
    return _table(header, lines)


def _full_table(rows: list[Row]) -> str:
    lines = [
        [
            r.model,
            str(r.batch),
            f"{r.nodes} x {r.devices_per_node}",
            _ms(r.topology_cost),
            _ms(r.full_cost_of_paper_plan),
            _ms(r.full_cost),
            _pct(r.full_saving),
            f"{r.full_search_time:.2f}",
        ]
        for r in rows
        if r.full_cost is not None
        and r.full_cost_of_paper_plan is not None
        and r.full_saving is not None
        and r.full_search_time is not None
    ]
    header = [
        "model",
        "batch",
        "nodes x devices",
        "paper's model (ms)",
        "its plan, full model (ms)",
        "full model's plan (ms)",
        "saving",
        "full search (s)",
    ]
    return _table(header, lines)


def _pivot(rows: list[Row], column: Callable[[Row], float], header: str) -> str:
    """Reductions against the best tie: one line per model and node count, one column per
    ``column`` value."""
    cols = sorted({column(r) for r in rows})
    keys = list(dict.fromkeys((r.model, r.nodes) for r in rows))
    cell = {(r.model, r.nodes, column(r)): _pct(r.saving_vs_best_tie) for r in rows}
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
        "## The full model (what engines run)",
        "The paper's model prices forward redistributions (Algorithm 1), all_reduces every "
        "partial output and every gradient at its operator, and lets copies of a tensor on one "
        "node share an inter-node transfer. The full model prices the training step: partial "
        "sums flow to their consumer, every edge pays its backward redistribution, a bias needs"
        " no gradient all_reduce where it is already whole, every edge is planned by Algorithm "
        "1 (as in the paper's model: the optimal planner is too slow for these runs yet), and "
        "every copy sends its own transfer (flat replicas, as NCCL and XLA). Comparison runs: "
        "the paper's topology-aware plan and its cost, that plan priced under the full model, "
        "and the full model's own optimum; *saving* is how much less time the full model's plan"
        " takes than the paper's plan, both priced under the full model.",
        _full_table(comparison),
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
