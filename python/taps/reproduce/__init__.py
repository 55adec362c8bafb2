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

The package: :mod:`~taps.reproduce.cases` (what runs), :mod:`~taps.reproduce.run` (running it),
:mod:`~taps.reproduce.report` (CSV and markdown), :mod:`~taps.reproduce.figures` (matplotlib).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from taps._support.outputs import staged_directory
from taps.reproduce.cases import (
    DEVICES_PER_NODE,
    TOLERANCE,
    Case,
    TimingCase,
    experiment_cases,
    timing_cases,
)
from taps.reproduce.figures import check_available, plot_comparison, plot_ratio
from taps.reproduce.report import headline, report, write_csv
from taps.reproduce.run import (
    CSV_COLUMNS,
    Row,
    TimingRow,
    median_search,
    run,
    run_case,
    time_search,
)

FILES = ("results.csv", "search_times.csv", "report.md", "comparison.png", "ratio.png")

__all__ = [
    "CSV_COLUMNS",
    "DEVICES_PER_NODE",
    "FILES",
    "TOLERANCE",
    "Case",
    "Row",
    "TimingCase",
    "TimingRow",
    "experiment_cases",
    "headline",
    "median_search",
    "reproduce",
    "run_case",
    "time_search",
    "timing_cases",
]


def reproduce(out: Path, quick: bool, console: Console) -> tuple[list[Row], list[TimingRow]]:
    """Run the experiments and write :data:`FILES` into ``out`` (created if missing): all of them
    once the run is done, or none (an error or Ctrl-C leaves the old files)."""
    check_available()
    with staged_directory(out) as stage:
        rows, timing_rows = run(experiment_cases(quick), timing_cases(quick), console)
        write_csv(stage / "results.csv", CSV_COLUMNS, (r.csv_dict() for r in rows))
        write_csv(
            stage / "search_times.csv",
            timing_rows[0].csv_dict().keys() if timing_rows else (),
            (t.csv_dict() for t in timing_rows),
        )
        (stage / "report.md").write_text(report(rows, timing_rows, quick), encoding="utf-8")
        plot_comparison(rows, stage / "comparison.png")
        plot_ratio(rows, stage / "ratio.png")
    for line in headline(rows).lines():
        console.print(line)
    console.print(f"wrote {', '.join(FILES)} into {out}", markup=False)
    return rows, timing_rows
