"""Whole models at the speed of one layer: the search on stacks of GPT-3 layers (hidden 12288,
96 heads, sequence 2048, batch 16) and on one layer standing for many, with and without a memory
limit that binds, against the search as it was before shared tables, ties and the price on memory
(``share=False, tie=False, IlpOptions(price=False)``) in the same run.

Run: ``.venv/bin/python benches/scale.py`` (``--quick``: the small cases only; ``--against REV``:
also the same search with the taps package of git revision REV, the code before a change, in the
same run). Each case runs in a fresh interpreter, which reports its time, the result and its own
peak resident memory. Binding limits sit halfway between the least memory any assignment needs and
the memory of the optimum without a limit.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

import taps
from peak_memory import in_fresh_process, package_at
from taps import TapsError
from taps.search.tables import build_tables
from taps.solve.pipeline import smallest_memory, solve

#: The baseline is given this much address space (the untied search under a binding limit hands
#: SCIP millions of variables: 96 layers outgrew this machine's 24 GiB).
BASELINE_MEMORY = 12 * 2**30
#: The baseline is given this long.
BASELINE_LIMIT = 120.0


@dataclass(frozen=True)
class Case:
    label: str
    blocks: int
    devices: int
    #: Where the limit sits between the least memory and the unlimited optimum's (None: no limit).
    binding: float | None = None
    tie: bool = True
    #: One layer standing for this many (``layers``), at batch 1024, with an 80 GB limit.
    layers: int | None = None


def _graph(case: Case) -> taps.Graph:
    if case.layers is not None:
        return taps.models.gpt(12288, 96, 2048, 1024, layers=case.layers)
    return taps.models.gpt(12288, 96, 2048, 16, blocks=case.blocks, tie=True)


def _limit(case: Case, graph: taps.Graph, cluster: taps.Cluster) -> float | None:
    if case.layers is not None:
        return 80e9
    if case.binding is None:
        return None
    least = smallest_memory(build_tables(graph, cluster))
    free = taps.search(graph, cluster).memory_per_device
    return least + case.binding * (free - least)


def run(case: Case, baseline: bool) -> dict[str, float | str]:
    graph = _graph(case)
    cluster = taps.Cluster(case.devices // 8, 8)
    limit = _limit(case, graph, cluster)
    t0 = time.perf_counter()
    tables = math.nan
    if baseline:
        share_none = build_tables(graph, cluster, share=False)
        options = taps.IlpOptions(price=False)
        try:
            solution = solve(share_none, limit, BASELINE_LIMIT, options, tie=False)
        except TapsError:  # SCIP found no assignment in the time given
            return {"seconds": BASELINE_LIMIT, "cost": math.inf, "status": "none in time"}
        cost, status, gap = share_none.evaluate(solution.choice), solution.status, solution.gap
    else:
        r = taps.search(graph, cluster, memory_limit=limit, tie=case.tie)
        cost, status, gap = r.cost, r.status, r.gap
        tables = r.timings["enumerate"] + r.timings["costs"]
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "cost": cost, "status": status, "gap": gap, "tables": tables}


def cases(quick: bool) -> list[Case]:
    out = [
        Case("16 layers", 16, 64),
        Case("96 layers", 96, 1024),
        Case("16 layers, binding", 16, 64, 0.5),
        Case("96 layers, binding", 96, 64, 0.5),
        Case("16 layers, binding", 16, 1024, 0.5),
        Case("96 layers, binding", 96, 1024, 0.5),
        Case("1 layer x 12, 80 GB", 1, 1024, layers=12),
    ]
    if not quick:
        out += [
            Case("96 layers", 96, 4096),
            Case("96 layers, untied", 96, 1024, tie=False),
            Case("4 layers, untied, binding", 4, 64, 0.5, tie=False),
            Case("1 layer x 12, 80 GB", 1, 4096, layers=12),
            Case("1 layer x 96, 80 GB", 1, 4096, layers=96),
        ]
    return out


def _same(mine: dict, other: dict) -> str:
    """Whether two runs found the same cost (or the ratio of ``mine`` to ``other``'s)."""
    mine_cost, other_cost = float(mine["cost"]), float(other["cost"])
    if math.isinf(other_cost):
        return f"other: {other['status']}"
    if abs(mine_cost - other_cost) <= 1e-9 * other_cost:
        return "yes"
    return f"{mine_cost / other_cost:.4f}x"  # tied against untied: never below 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the small cases only")
    parser.add_argument("--no-baseline", action="store_true", help="skip the baseline runs")
    parser.add_argument("--against", metavar="REV", help="also search with taps at git REV")
    parser.add_argument("--match", default="", help="only the cases whose label has this text")
    args = parser.parse_args()
    table = Table(title="Search time on stacked GPT-3 layers (median-free: one run each)")
    columns = ["case", "devices", "taps", "peak"]
    if args.against:
        columns += [args.against, "ratio", "same cost"]
    if not args.no_baseline:
        columns += ["baseline", "speed-up", "same cost"]
    for column in columns:
        table.add_column(column, justify="right")
    with contextlib.ExitStack() as stack:
        before = stack.enter_context(package_at(args.against)) if args.against else None
        for case in [c for c in cases(args.quick) if args.match in c.label]:
            mine, peak = in_fresh_process(run, case, False)
            cells = [
                case.label,
                str(case.devices),
                f"{mine['seconds']:.2f} s (tables {mine['tables']:.2f} s; {mine['status']}, "
                f"gap {mine['gap']:.1g})",
                f"{peak:,.0f} MiB",
            ]
            if before is not None:
                then, then_peak = in_fresh_process(run, case, False, package=before)
                cells += [
                    f"{then['seconds']:.2f} s (tables {then['tables']:.2f} s), "
                    f"{then_peak:,.0f} MiB",
                    f"{float(then['seconds']) / float(mine['seconds']):.1f}x",
                    _same(mine, then),
                ]
            if not args.no_baseline:
                try:
                    base, _ = in_fresh_process(run, case, True, memory_limit=BASELINE_MEMORY)
                except (BrokenProcessPool, MemoryError):
                    base = {"seconds": math.nan, "cost": math.inf, "status": "out of memory"}
                cells += [
                    f"{base['seconds']:.2f} s ({base['status']})",
                    "-"
                    if math.isnan(float(base["seconds"]))
                    else f"{float(base['seconds']) / float(mine['seconds']):.1f}x",
                    _same(mine, base),
                ]
            table.add_row(*cells)
    Console().print(table)


if __name__ == "__main__":
    main()
