"""CPU time per layout pair of Algorithm 1's cost kernel on the biggest table of a model's search.

Converts a model of ``benches/model_families.py``, searches it on ``taps.Cluster(8, 8)`` while
keeping the arguments of its largest ``redistribution_costs`` call, then times that call again
(process CPU time, best of ``--repeat``) and prints the SHA-256 of its matrix, so that two builds
can be compared for speed and for identical costs. Run it with ``RAYON_NUM_THREADS=1`` for a
figure that depends less on the load:

    RAYON_NUM_THREADS=1 python benches/pair_kernel.py timm_swin
    RAYON_NUM_THREADS=1 python benches/pair_kernel.py jax_llama --repeat 2
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
import warnings
from typing import Any

import numpy as np

import taps
from model_families import builders
from taps.search import tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a name of benches/model_families.py")
    parser.add_argument("--repeat", type=int, default=3, help="timings of the call (best kept)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    graph = builders()[args.model]()
    biggest: list[tuple[Any, ...]] = []
    priced = tables.redistribution_costs

    def keep(s: Any, t: Any, *rest: Any, **kw: Any) -> Any:
        if not biggest or len(s) * len(t) > len(biggest[0][0]) * len(biggest[0][1]):
            biggest[:] = [(list(s), list(t), *rest)]
        return priced(s, t, *rest, **kw)

    tables.redistribution_costs = keep  # type: ignore[assignment]
    taps.search(graph, taps.Cluster(8, 8))
    tables.redistribution_costs = priced
    sources, targets, *rest = biggest[0]
    best = float("inf")
    for _ in range(args.repeat):
        start = time.process_time()
        costs = priced(sources, targets, *rest)
        best = min(best, time.process_time() - start)
    pairs = len(sources) * len(targets)
    digest = hashlib.sha256(np.ascontiguousarray(costs).tobytes()).hexdigest()[:16]
    print(
        f"{args.model}: {len(sources)} x {len(targets)} pairs, CPU {best:.3f} s, "
        f"{best / pairs * 1e6:.3f} us/pair, sha256 {digest}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
