"""CPU time per layout pair of Algorithm 1's cost kernel on the biggest table of a model's search.

Converts a model of ``benches/model_families.py``, searches it on ``taps.Cluster(8, 8)`` while
keeping the arguments of its largest ``redistribution_costs`` call (with ``--every``, of every
call), then times the call(s) again (process CPU time, best of ``--repeat``) and prints the
SHA-256 of each matrix, so that two builds can be compared for speed and for identical costs.
With ``--calls FILE`` the kept calls are written to FILE (pickle) and, when FILE exists, read
from it instead of searching: the other build, or ``valgrind``, replays the same calls without
the search. Run it with ``RAYON_NUM_THREADS=1`` for a figure that depends less on the load:

    RAYON_NUM_THREADS=1 python benches/pair_kernel.py timm_swin
    RAYON_NUM_THREADS=1 python benches/pair_kernel.py jax_llama --repeat 2
    RAYON_NUM_THREADS=1 python benches/pair_kernel.py swin --every --calls /tmp/swin.pkl
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

import taps
from model_families import builders
from taps.search import tables


def _captured(model: str, every: bool) -> list[tuple[Any, ...]]:
    """The arguments of the largest ``redistribution_costs`` call of the model's search on 8 x 8,
    or of every call."""
    graph = builders()[model]()
    calls: list[tuple[Any, ...]] = []
    priced = tables.redistribution_costs

    def keep(s: Any, t: Any, *rest: Any, **kw: Any) -> Any:
        if every:
            calls.append((list(s), list(t), *rest))
        elif not calls or len(s) * len(t) > len(calls[0][0]) * len(calls[0][1]):
            calls[:] = [(list(s), list(t), *rest)]
        return priced(s, t, *rest, **kw)

    tables.redistribution_costs = keep  # type: ignore[assignment]
    try:
        taps.search(graph, taps.Cluster(8, 8))
    finally:
        tables.redistribution_costs = priced
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a name of benches/model_families.py")
    parser.add_argument("--repeat", type=int, default=3, help="timings of the call (best kept)")
    parser.add_argument("--every", action="store_true", help="every call, not the largest")
    parser.add_argument("--calls", type=Path, help="the kept calls: read if present, else written")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    if args.calls and args.calls.exists():
        calls = pickle.loads(args.calls.read_bytes())
    else:
        calls = _captured(args.model, args.every)
        if args.calls:
            args.calls.write_bytes(pickle.dumps(calls))
    best = float("inf")
    for _ in range(args.repeat):
        start = time.process_time()
        matrices = [tables.redistribution_costs(s, t, *rest) for s, t, *rest in calls]
        best = min(best, time.process_time() - start)
    # The SHA-256 of the matrices one after the other (of the one matrix, for one call).
    digest = hashlib.sha256()
    for costs in matrices:
        digest.update(np.ascontiguousarray(costs).tobytes())
    pairs = sum(len(s) * len(t) for s, t, *_ in calls)
    print(
        f"{args.model}: {len(calls)} call(s), {pairs} pairs, CPU {best:.3f} s, "
        f"{best / pairs * 1e9:.0f} ns/pair, sha256 {digest.hexdigest()[:16]}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
