"""Search time by cost model and planner, on the paper's search-time cases and the GPT-3 layer.

Columns (wall / CPU seconds, the CPU of every thread of the process): the paper's model
(``step="forward"``, Algorithm 1), the training step with Algorithm 1 (the default) and with the
optimal planner, each the median of ``--repeat`` runs after a warm-up (the optimal planner: one
run after a warm-up with Algorithm 1, so that its memo of paths starts empty), and the ratio of
the optimal planner's time to the default's; then each planner's first search in a fresh process
(``--repeat`` processes each, taking turns, the median), as ``taps search`` runs it: no memo
holds any of the case's pairs (a search of a small MLP on 4 devices loads the imports first), and
the ratio. ``--against PYTHON`` also times the default search of another installation of taps
(the interpreter of a virtualenv holding it, e.g. one built at the commit before the training
step) on the same cases, for the ratio of today's default to it.

Run: ``.venv/bin/python benches/planners.py`` (``--large`` adds the GPT-3 layer on 1024 devices,
whose optimal-planner search takes minutes; ``--no-optimal`` skips that column; ``--only TEXT``
times only the cases whose label holds one of the texts, e.g. ``--only "AlexNet, 16" "1T"``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from taps.reproduce import DEVICES_PER_NODE, timing_cases


@dataclass(frozen=True)
class Case:
    label: str
    #: Python that builds ``graph`` and ``cluster`` with ``import taps`` (run here and by
    #: ``--against``, so only long-standing API).
    build: str


def cases(large: bool) -> list[Case]:
    out = [
        Case(
            f"{t.label}, {t.nodes * DEVICES_PER_NODE} devices",
            f"graph = taps.models.by_name({t.model!r})\n"
            # The Megatron models fit no V100 (the default device): memory is not what is timed.
            f"cluster = taps.Cluster({t.nodes}, {DEVICES_PER_NODE}, device_memory=float('inf'))",
        )
        for t in timing_cases(False)
    ]
    if large:
        out.append(
            Case(
                "GPT-3 layer, 1024 devices",
                "graph = taps.models.gpt(hidden=12288, heads=96, seq=2048, batch=16)\n"
                "cluster = taps.Cluster(128, 8)",
            )
        )
    return out


#: Times ``search(**kwargs)`` on the case ``build`` makes: one warm-up run with ``warmup`` (the
#: same options, or Algorithm 1's for the optimal planner: the imports and caches every search
#: fills are then warm, and the optimal planner's memo of paths still empty), then ``repeat``
#: runs; prints the median wall and CPU seconds (every thread of the process: on a loaded machine
#: the wall time measures the load as much as the search) and the cost as JSON.
TIMER = """
import json, statistics, sys, time
import taps
{build}
def run(kwargs):
    # This installation takes a Pricing; an older one (--against) its choices one by one.
    if hasattr(taps, "Pricing"):
        return taps.search(graph, cluster, taps.Pricing(**kwargs))
    return taps.search(graph, cluster, **kwargs)
run({warmup})
runs, cpu = [], []
for k in range({repeat}):
    t, c = time.perf_counter(), time.process_time()
    result = run({kwargs})
    runs.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
print(json.dumps([statistics.median(runs), statistics.median(cpu), result.cost]))
"""


#: Times the first search of the case ``build`` makes in this process (with ``{kwargs}``), after
#: a search of a small MLP on 4 devices that loads the imports (its pairs are no pairs of the
#: case's); prints the wall and CPU seconds and the cost as JSON.
FIRST = """
import json, time
import taps
warm = taps.Pricing(**{kwargs})
taps.search(taps.models.mlp(), taps.Cluster(2, 2), warm)
{build}
t, c = time.perf_counter(), time.process_time()
result = taps.search(graph, cluster, taps.Pricing(**{kwargs}))
print(json.dumps([time.perf_counter() - t, time.process_time() - c, result.cost]))
"""


def first(case: Case, repeat: int) -> tuple[tuple[float, float, float], ...]:
    """Per planner (Algorithm 1, then the optimal planner), the median wall and CPU seconds and
    the cost of the first search of ``case`` in ``repeat`` fresh processes, the planners taking
    turns."""
    runs: list[list[list[float]]] = [[], []]
    for _ in range(repeat):
        for k, planner in enumerate(("paper", "optimal")):
            code = FIRST.format(build=case.build, kwargs={"planner": planner})
            out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
            runs[k].append(json.loads(out.stdout.decode().strip().splitlines()[-1]))
    return tuple(
        (
            statistics.median(r[0] for r in rows),
            statistics.median(r[1] for r in rows),
            rows[0][2],
        )
        for rows in runs
    )


def timed(python: str, case: Case, repeat: int, **kwargs: str) -> tuple[float, float, float]:
    """Median wall and CPU seconds and the cost of ``repeat`` searches of ``case`` with
    ``kwargs`` under ``python``, after a warm-up (with Algorithm 1 when ``kwargs`` asks for the
    optimal planner, whose memo would answer every later run)."""
    warmup = {**kwargs, "planner": "paper"} if kwargs.get("planner") == "optimal" else kwargs
    code = TIMER.format(build=case.build, repeat=repeat, kwargs=kwargs, warmup=warmup)
    out = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True)
    seconds, cpu, cost = json.loads(out.stdout.strip().splitlines()[-1])
    return seconds, cpu, cost


def pair(timing: tuple[float, float, float]) -> str:
    """A timing's wall and CPU seconds."""
    return f"{timing[0]:.3f} / {timing[1]:.3f} s"


def ratios(one: tuple[float, float, float], other: tuple[float, float, float]) -> str:
    """The ratios of two timings' wall and CPU seconds."""
    return f"{one[0] / other[0]:.2f}x / {one[1] / other[1]:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--large", action="store_true", help="add the GPT-3 layer on 1024 devices")
    parser.add_argument("--no-optimal", action="store_true", help="skip the optimal planner")
    parser.add_argument("--repeat", type=int, default=5, help="runs per Algorithm 1 column")
    parser.add_argument("--against", metavar="PYTHON", help="also time this interpreter's taps")
    parser.add_argument("--only", nargs="+", metavar="TEXT", help="the cases whose label holds one")
    args = parser.parse_args()
    table = Table(title="taps.search by cost model and planner (median seconds: wall / CPU)")
    columns = ["case", "forward, Algorithm 1", "training, Algorithm 1", "ratio"]
    if not args.no_optimal:
        columns += ["training, optimal planner", "/ default", "its cost against Algorithm 1's"]
        columns += ["first search: default", "first: optimal", "/ default"]
    if args.against:
        columns += ["default of --against", "default now / it"]
    for column in columns:
        table.add_column(column, justify="right")
    here = sys.executable
    for case in cases(args.large):
        if args.only and not any(text in case.label for text in args.only):
            continue
        started = time.perf_counter()
        forward = timed(here, case, args.repeat, step="forward")
        training = timed(here, case, args.repeat)
        cells = [case.label, pair(forward), pair(training), ratios(training, forward)]
        if not args.no_optimal:
            optimal = timed(here, case, 1, planner="optimal")
            cells += [
                pair(optimal),
                ratios(optimal, training),
                f"{optimal[2] / training[2] - 1:+.1%}",
            ]
            paper, best = first(case, args.repeat)
            cells += [pair(paper), pair(best), ratios(best, paper)]
        if args.against:
            before = timed(args.against, case, args.repeat)
            cells += [pair(before), ratios(training, before)]
        table.add_row(*cells)
        Console(stderr=True).print(f"{case.label}: {time.perf_counter() - started:.0f} s")
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
