"""The memory-bound search of distinct (untied) GPT-3 layers on 1,024 devices (issue 25): the
limit halfway between the least memory any plan needs and the unconstrained optimum's, the
search in a fresh interpreter under an address-space cap. Prints the layers, the time of the
limited solve (wall and the process's CPU: on a shared machine the wall time is what the load
leaves), its status and gap, and the peak resident memory.

    python benches/memory_bound.py [--layers 4 8 12 96] [--cap-gib 8]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures.process import BrokenProcessPool

import taps
from peak_memory import in_fresh_process, own_peak_mib
from taps import models
from taps.search.tables import build_tables
from taps.solve.pipeline import smallest_memory, solve


def limited_search(blocks: int) -> tuple[float, float, str, float, float]:
    """(seconds of the limited solve, its CPU seconds, status, gap, peak MiB) of ``blocks``
    distinct layers."""
    graph = models.gpt(
        models.GPT3_HIDDEN, models.GPT3_HEADS, models.GPT3_SEQ, models.GPT_BATCH, blocks=blocks
    )
    tables = build_tables(graph, taps.Cluster(128, 8))
    free = solve(tables)
    used = tables.layers * sum(float(tables.memory_per_op[v][i]) for v, i in free.choice.items())
    limit = (smallest_memory(tables) + used) / 2
    t0, c0 = time.perf_counter(), time.process_time()
    run = solve(tables, memory_limit=limit)
    return (
        time.perf_counter() - t0,
        time.process_time() - c0,
        run.status,
        run.gap,
        own_peak_mib(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 8, 12, 96])
    parser.add_argument("--cap-gib", type=float, default=8.0)
    args = parser.parse_args()
    cap = int(args.cap_gib * 2**30)
    print(f"{'layers':>6} {'solve s':>8} {'CPU s':>8} {'status':>10} {'gap':>6} {'peak MiB':>9}")
    for blocks in args.layers:
        try:
            (seconds, cpu, status, gap, peak), _ = in_fresh_process(
                limited_search, blocks, memory_limit=cap
            )
        except (BrokenProcessPool, MemoryError) as e:
            print(f"{blocks:>6} failed under the {args.cap_gib:g} GiB cap: {e!r}")
            continue
        print(f"{blocks:>6} {seconds:>8.2f} {cpu:>8.2f} {status:>10} {gap:>6.2g} {peak:>9.0f}")


if __name__ == "__main__":
    main()
