"""The search's cost tables on one model family on 8 x 8, split into Algorithm 1's kernel and
the rest (the memo's reads, the edges' sums, the classes: the Python and numpy around the
kernel), CPU and wall clock, with the load average before and after.

    PYTHONPATH=python python benches/costs_stage.py jax_llama timm_swin

Each model is converted (not timed) and searched once in this process, with
``redistribution_costs`` and ``build_tables`` wrapped in timers; run it under two builds one
after the other to compare them (docs/performance.md).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import model_families
import taps
import taps.search.searching as searching
import taps.search.tables as tables


def _timed(f: Callable[..., Any], spent: list[float]) -> Callable[..., Any]:
    """``f``, adding the CPU and wall seconds of each call to ``spent``."""

    def run(*args: Any, **kwargs: Any) -> Any:
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            spent[0] += time.process_time() - cpu
            spent[1] += time.perf_counter() - wall

    return run


def main() -> None:
    builders = model_families.builders()
    for name in sys.argv[1:]:
        graph = builders[name]()
        kernel, built = [0.0, 0.0], [0.0, 0.0]
        tables.redistribution_costs = _timed(taps.redistribution_costs, kernel)
        searching.build_tables = _timed(tables.build_tables, built)
        load = os.getloadavg()[0]
        cpu, wall = time.process_time(), time.perf_counter()
        taps.search(graph, taps.Cluster(8, 8))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(
            f"{name:10s} search CPU {cpu:6.2f} s wall {wall:6.2f} s | tables CPU {built[0]:5.2f}"
            f" wall {built[1]:5.2f}, kernel CPU {kernel[0]:5.2f} wall {kernel[1]:5.2f}, outside"
            f" the kernel CPU {built[0] - kernel[0]:5.2f} wall {built[1] - kernel[1]:5.2f}"
            f" | load {load:.2f} -> {os.getloadavg()[0]:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
