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

from collections.abc import Mapping

from rich.console import Console

from taps._support.outputs import OutputFile
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
    "write_files",
]


def reproduce(quick: bool, console: Console) -> tuple[list[Row], list[TimingRow]]:
    """Run the experiments (:func:`write_files` writes what they found)."""
    check_available()
    rows, timing_rows = run(experiment_cases(quick), timing_cases(quick), console)
    for line in headline(rows).lines():
        console.print(line)
    return rows, timing_rows


def write_files(
    rows: list[Row], timing_rows: list[TimingRow], quick: bool, files: Mapping[str, OutputFile]
) -> None:
    """Write each of :data:`FILES` into its output file (taps.cli.reproduce commits them with
    the command's other outputs, all or none)."""
    with files["results.csv"].writing():
        write_csv(files["results.csv"].temp, CSV_COLUMNS, (r.csv_dict() for r in rows))
    with files["search_times.csv"].writing():
        write_csv(
            files["search_times.csv"].temp,
            timing_rows[0].csv_dict().keys() if timing_rows else (),
            (t.csv_dict() for t in timing_rows),
        )
    files["report.md"].write_text(report(rows, timing_rows, quick))
    with files["comparison.png"].writing():
        plot_comparison(rows, files["comparison.png"].temp)
    with files["ratio.png"].writing():
        plot_ratio(rows, files["ratio.png"].temp)
