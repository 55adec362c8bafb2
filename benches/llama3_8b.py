"""torchtitan's Llama 3 8B (32 layers, batch 16 x 8,192 tokens, bf16, SDPA) on dgx-h100 with 8
nodes (64 H100 of 80 GB): does it fit, how fast is it searched, and where does the memory go.

    python benches/llama3_8b.py                 # the default pricing, median of 3 searches
    python benches/llama3_8b.py --repeat 5      # more runs
    python benches/llama3_8b.py --checkpoint 1  # with every layer checkpointed

Prints the search time (median of ``--repeat`` runs after one warm-up), the memory per device of
the plan found under the preset's 80 GB and without a limit, the three operators that need the
most at their least, and what the model needed when attention kept its scores (``saved``
cleared, as before fused attention was modelled): the one-line refusal.
"""

from __future__ import annotations

import argparse
import statistics
import time

import taps
from frontend_torch import tied_llama3
from taps.search.tables import build_tables
from taps.solve.pipeline import largest_needs, smallest_memory


def unfused(graph: taps.Graph) -> taps.Graph:
    """The same graph with every output kept (attention keeping its scores and probabilities)."""
    doc = graph.to_dict()
    for op in doc["ops"]:
        op["output"].pop("saved", None)
    return taps.Graph.from_dict(doc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--checkpoint", type=int, default=0)
    args = parser.parse_args()
    graph = tied_llama3("8B", args.batch, args.seq)
    cluster = taps.Cluster.preset("dgx-h100", args.nodes)
    pricing = taps.Pricing(checkpoint=args.checkpoint)
    limit = cluster.device_memory
    print(
        f"llama3-8B, batch {args.batch} x {args.seq}, {len(graph.ops)} operators, "
        f"{graph.num_parameters() / 1e9:.2f}B parameters; dgx-h100 x {args.nodes} "
        f"({cluster.num_devices} devices, {limit / 1e9:g} GB each), checkpoint {args.checkpoint}"
    )
    taps.search(graph, cluster, pricing)  # warm-up
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        result = taps.search(graph, cluster, pricing)
        times.append(time.perf_counter() - t0)
    stages = ", ".join(f"{k} {v:.2f}" for k, v in result.timings.items())
    print(
        f"  search under {limit / 1e9:g} GB: median {statistics.median(times):.2f} s of "
        f"{args.repeat} (stages of the last: {stages}); status {result.status}, cost "
        f"{result.cost * 1e3:.1f} ms, memory {result.memory_per_device / 1e9:.1f} GB per device"
    )
    free = taps.search(graph, cluster, pricing, memory_limit=1e30)
    print(
        f"  without a limit: cost {free.cost * 1e3:.1f} ms, memory "
        f"{free.memory_per_device / 1e9:.1f} GB per device"
    )
    tables = build_tables(graph, cluster, pricing)
    most = ", ".join(f"{name} x{n} {size / 1e9:.1f} GB" for name, n, size in largest_needs(tables))
    print(f"  least memory {smallest_memory(tables) / 1e9:.1f} GB per device; most: {most}")
    try:
        kept = taps.search(unfused(graph), cluster, pricing)
        print(f"  attention keeping its scores: {kept.memory_per_device / 1e9:.1f} GB per device")
    except taps.InfeasibleError as e:
        print(f"  attention keeping its scores: {e}")


if __name__ == "__main__":
    main()
