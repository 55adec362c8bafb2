"""How tight the optimal planner's lower bounds are, and what they cost its search.

For a paper timing case (``--case``, the start of its label, e.g. ``"AlexNet, 16 "``): every
distinct layout pair of its bounded tables (``build_tables(..., bounded=True)``), priced one by
one with ``taps.redistribution_bounds`` and ``taps.redistribution_costs(planner="optimal")``, the
bound over the optimum (``--ratios``); and one optimal search after two default ones in this
process (so that the optimal planner's memo starts empty), its CPU seconds, rounds, bounded tables
and refinements. Run in a fresh process per case:
``.venv/bin/python benches/optimal_bounds.py --case "AlexNet, 16 " --ratios``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from typing import Any

import numpy as np

import taps
import taps.search.searching as searching
import taps.search.tables as tables
from taps.reproduce import DEVICES_PER_NODE, timing_cases

OPTIMAL = taps.Pricing(planner="optimal")


def case_of(label: str) -> tuple[taps.Graph, taps.Cluster]:
    (case,) = [
        t
        for t in timing_cases(False)
        if f"{t.label}, {t.nodes * DEVICES_PER_NODE} devices".startswith(label)
    ]
    cluster = taps.Cluster(case.nodes, DEVICES_PER_NODE, device_memory=float("inf"))
    return taps.models.by_name(case.model), cluster


def plan_digest(result: taps.SearchResult) -> str:
    """The plan's strategies, digested: equal across builds where the plans are."""
    strategies = sorted((name, repr(s)) for name, s in result.plan.strategies.items())
    return hashlib.sha1(repr(strategies).encode()).hexdigest()[:12]


def ratios(graph: taps.Graph, cluster: taps.Cluster) -> None:
    bounds: list[Any] = []
    made = tables._Bound.__init__

    def record(self: Any, *args: Any) -> None:
        made(self, *args)
        bounds.append(self)

    tables._Bound.__init__ = record  # type: ignore[method-assign]
    tables.build_tables(graph, cluster, OPTIMAL, bounded=True)
    tables._Bound.__init__ = made  # type: ignore[method-assign]
    pairs: dict[tuple[taps.Layout, taps.Layout], None] = {}
    for b in bounds:
        ends = [([r[0] for r in b.src], [r[0] for r in b.dst])]
        if b.backward:
            ends.append(([r[1] for r in b.dst], [r[1] for r in b.src]))
        for sources, targets in ends:
            pairs.update(((s, t), None) for s in sources for t in targets)
    lb = np.array([taps.redistribution_bounds([s], [t], cluster)[0][0, 0] for s, t in pairs])
    ex = np.array(
        [taps.redistribution_costs([s], [t], cluster, planner="optimal")[0, 0] for s, t in pairs]
    )
    r = lb[ex > 0] / ex[ex > 0]
    print(
        f"{len(r)} pairs moving something: bound / optimum mean {r.mean():.3f}, median "
        f"{np.median(r):.3f}, under 0.5: {(r < 0.5).sum()}, under 0.25: {(r < 0.25).sum()}"
    )


def timed(graph: taps.Graph, cluster: taps.Cluster) -> None:
    stats = {"rounds": 0, "refine": 0.0, "tables": 0.0}
    build = searching.build_tables

    def counted(*args: Any, **kwargs: Any) -> Any:
        t = time.process_time()
        out = build(*args, **kwargs)
        stats["tables"] += time.process_time() - t
        if out.refine is not None:
            refine = out.refine

            def refined(choice: Any) -> bool:
                t = time.process_time()
                stats["rounds"] += 1
                done = refine(choice)
                stats["refine"] += time.process_time() - t
                return done

            out.refine = refined
        return out

    searching.build_tables = counted  # type: ignore[assignment]
    for _ in range(2):
        searching.search(graph, cluster)
    t = time.process_time()
    searching.search(graph, cluster)
    default = time.process_time() - t
    stats.update(rounds=0, refine=0.0, tables=0.0)
    t = time.process_time()
    result = searching.search(graph, cluster, OPTIMAL)
    optimal = time.process_time() - t
    digest = plan_digest(result)
    print(
        f"default {default:.3f} s, optimal {optimal:.3f} s ({optimal / default:.1f}x), "
        f"rounds {stats['rounds']}, bounded tables {stats['tables']:.3f} s, refinements "
        f"{stats['refine']:.3f} s, cost {result.cost!r}, plan {digest}, "
        f"load {os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, help='start of a label, e.g. "AlexNet, 16 "')
    parser.add_argument("--ratios", action="store_true", help="also the bounds over the optima")
    args = parser.parse_args()
    graph, cluster = case_of(args.case)
    if args.ratios:
        ratios(graph, cluster)
    timed(graph, cluster)


if __name__ == "__main__":
    main()
