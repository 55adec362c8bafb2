"""The search on graphs that are not series-parallel, where the exact reductions leave a core:
residual connections across several blocks (``skip_ladder``: every block's output adds the
outputs of the 3 or 4 blocks before it) and an Inception-style CNN whose branches cross
(``inception``), both from ``tests/graphs_gen.py``. Each case runs with variable elimination
(the default) and without it (``IlpOptions(eliminate=False)``: SCIP solves the core, as before
elimination existed) in the same run, and the two costs are compared.

Run: ``.venv/bin/python benches/non_series_parallel.py`` (``--quick``: the 64-device cases only).
Each search runs in a fresh interpreter, which reports its time and its own peak resident memory.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

import taps
from peak_memory import in_fresh_process

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from graphs_gen import inception, skip_ladder

#: SCIP on the core is given this long.
ILP_LIMIT = 120.0


@dataclass(frozen=True)
class Case:
    label: str
    build: Callable[[], taps.Graph]
    devices: int


def cases(quick: bool) -> list[Case]:
    out = [
        Case("skip ladder, reach 3, 125 blocks", lambda: skip_ladder(125, 3, 1024, 1024), 64),
        Case("skip ladder, reach 4, 125 blocks", lambda: skip_ladder(125, 4, 1024, 1024), 64),
        Case("Inception, 41 blocks (b 64, c 128)", lambda: inception(41, 64, 128, 16), 64),
    ]
    if not quick:
        out += [
            Case("skip ladder, reach 3, 25 blocks", lambda: skip_ladder(25, 3, 8192, 8192), 1024),
            Case("skip ladder, reach 4, 25 blocks", lambda: skip_ladder(25, 4, 4096, 4096), 1024),
            Case("Inception, 8 blocks (b 128, c 256)", lambda: inception(8, 128, 256, 16), 1024),
        ]
    return out


def run(quick: bool, index: int, eliminate: bool) -> dict[str, float | str | int]:
    case = cases(quick)[index]
    graph = case.build()
    cluster = taps.Cluster(case.devices // 8, 8)
    options = taps.IlpOptions(eliminate=eliminate)
    t0 = time.perf_counter()
    r = taps.search(graph, cluster, options=options, time_limit=ILP_LIMIT)
    return {
        "seconds": time.perf_counter() - t0,
        "cost": r.cost,
        "status": r.status,
        "gap": r.gap,
        "ops": len(graph.ops),
        "left": r.ilp.operators,
        "variables": r.ilp.variables,
        "costs": r.timings["costs"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the 64-device cases only")
    args = parser.parse_args()
    table = Table(title="Graphs that are not series-parallel (one run each, fresh interpreter)")
    for column in (
        "case",
        "operators",
        "devices",
        "search",
        "decided by",
        "of which cost tables",
        "peak",
        "SCIP on the core",
        "core (operators, variables)",
        "speed-up",
        "same cost",
    ):
        table.add_column(column, justify="left" if column == "case" else "right")
    for index, case in enumerate(cases(args.quick)):
        mine, peak = in_fresh_process(run, args.quick, index, True)
        base, _ = in_fresh_process(run, args.quick, index, False)
        same = abs(float(mine["cost"]) - float(base["cost"])) <= 1e-9 * float(base["cost"])
        gap = float(mine["gap"])
        table.add_row(
            case.label,
            str(mine["ops"]),
            f"{case.devices:,}",
            f"{mine['seconds']:.2f} s ({mine['status']}, gap {'inf' if math.isinf(gap) else gap})",
            "elimination" if mine["left"] == 0 else f"SCIP ({mine['left']} operators)",
            f"{mine['costs']:.2f} s",
            f"{peak:,.0f} MiB",
            f"{base['seconds']:.2f} s ({base['status']})",
            f"{base['left']}, {base['variables']:,}",
            f"{float(base['seconds']) / float(mine['seconds']):.1f}x",
            "yes" if same else f"{float(mine['cost']) / float(base['cost']):.6f}x",
        )
        Console().print(f"done: {case.label}")
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
