"""The search's cost tables on 8 x 8 with Algorithm 1's kernel stubbed (each matrix filled with
ones): the Python and numpy around the kernel, CPU, min and median of K ``build_tables`` calls per
model, the GC off as in ``taps.search``. Run it under two builds in turn to compare them
(docs/performance.md).

    PYTHONPATH=python python benches/costs_python.py 3 timm_swin jax_llama
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from typing import Any

import numpy as np

import model_families
import taps
import taps.search.tables as tables


def _stub(s: Any, t: Any, *how: Any, time_limit: Any = None, out: Any = None) -> np.ndarray:
    """``redistribution_costs`` without the pricing: ones, into ``out`` if given."""
    if out is None:
        out = np.empty((len(s), len(t)))
    out[...] = 1.0
    return out


def main() -> None:
    tables.redistribution_costs = _stub
    k = int(sys.argv[1])
    builders = model_families.builders()
    for name in sys.argv[2:]:
        graph = builders[name]()
        gc.collect()
        gc.disable()
        times = []
        for _ in range(k):
            cpu = time.process_time()
            tables.build_tables(graph, taps.Cluster(8, 8), taps.Pricing())
            times.append(time.process_time() - cpu)
        gc.enable()
        print(
            f"{name:10s} CPU min {min(times):.3f} s median {statistics.median(times):.3f} s",
            [round(x, 3) for x in times],
            flush=True,
        )


if __name__ == "__main__":
    main()
