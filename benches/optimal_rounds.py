"""The optimal planner's rounds (docs/search.md, "Speed"): per case, one optimal search after a
default one (so that the imports are warm and the optimal planner's memo of paths empty), its
rounds (solves), the directed pairs its rounds priced (a pair's first search stops short: each
pricing counts), the CPU seconds of those pairs, of
the solves, of the bounded tables' bound calls (cheap bounds) and of the full bounds the rounds
gave the pairs that could be in an optimum (how many pairs), the whole search's CPU and wall
seconds, its
cost against the default plan's, and its plan's digest (equal across builds where the plans are).

Cases: a model of ``benches/model_families.py`` on 8 x 8 (``gemma2``), ``gpt3`` (the GPT-3 layer
on 1,024 devices) or the start of a paper timing case's label (``"AlexNet, 64 "``). Run:
``RAYON_NUM_THREADS=1 .venv/bin/python benches/optimal_rounds.py gemma2 "AlexNet, 64 "``
(``--time-limit`` seconds per search, default 1,500).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import taps
import taps.search.searching as searching
import taps.search.tables as tables
from optimal_bounds import case_of, plan_digest


def case(name: str) -> tuple[taps.Graph, taps.Cluster]:
    if name == "gpt3":
        graph = taps.models.gpt(hidden=12288, heads=96, seq=2048, batch=16)
        return graph, taps.Cluster(128, 8)
    try:
        return case_of(name)
    except ValueError:  # not a paper case's label: a model family's name
        pass
    here = Path(__file__).parent
    sys.path[:0] = [str(here), str(here.parent / "tests")]
    import model_families

    return model_families.builders()[name](), taps.Cluster(8, 8)


def counted(module: Any, name: str, stats: list[float], size: Callable[..., int]) -> None:
    """``module.name`` wrapped to add its CPU seconds, calls and ``size(*args)`` to ``stats``."""
    kernel = getattr(module, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        t = time.process_time()
        out = kernel(*args, **kwargs)
        stats[0] += time.process_time() - t
        stats[1] += 1
        stats[2] += size(*args)
        return out

    setattr(module, name, wrapped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+")
    parser.add_argument("--time-limit", type=float, default=1500.0)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    pairs, solves, bounds, full = [0.0, 0, 0], [0.0, 0, 0], [0.0, 0, 0], [0.0, 0, 0]
    counted(tables, "redistribution_pair_estimates", pairs, lambda s, *_: len(s))
    counted(tables, "redistribution_table_bounds", bounds, lambda s, t, *_: len(s) * len(t))
    counted(tables, "redistribution_pair_bounds", full, lambda s, *_: len(s))
    counted(searching, "solve", solves, lambda *_: 0)
    for name in args.cases:
        graph, cluster = case(name)
        default = taps.search(graph, cluster)
        for stats in (pairs, solves, bounds, full):
            stats[:] = [0.0, 0, 0]
        t, c = time.perf_counter(), time.process_time()
        result = taps.search(
            graph, cluster, taps.Pricing(planner="optimal"), time_limit=args.time_limit
        )
        cpu, wall = time.process_time() - c, time.perf_counter() - t
        digest = plan_digest(result)
        print(
            f"{name}: {solves[1]} rounds, {pairs[2]:,} pairs priced {pairs[0]:.3f} s, solves "
            f"{solves[0]:.3f} s, bounds {bounds[0]:.3f} s, {full[2]:,} full bounds {full[0]:.3f} "
            f"s; total {cpu:.3f} s CPU, {wall:.3f} s "
            f"wall; cost {result.cost!r} ({100 * (result.cost / default.cost - 1):+.1f}% against "
            f"the default's {default.cost!r}), plan {digest}, load {os.getloadavg()[0]:.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
