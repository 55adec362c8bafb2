"""The step-time search against the communication-only one, on the built-in models.

For every model and cluster: the plan the default search finds (compute counted: the predicted
step time) and the plan of the communication-only search (``Pricing(compute=False)``) priced
again under the step-time model; their step time, compute and exposed communication, how many
operators differ, and, with ``replicate=True``, how many operators each search copies whole to
every device. Memory is not limited (``--memory`` sets a limit in bytes per device). Prints a
Markdown table (docs/results.md).

Run: ``.venv/bin/python benches/step_time.py`` (``--nodes 2 8`` by default).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import taps
from taps.plan import Plan, Pricing

MODELS = ("alexnet", "mlp", "gpt", "megatron-1.7B", "megatron-3.6B")
CLUSTERS = ("dgx-v100", "dgx-h100")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f}"


def _whole(plan: Plan) -> int:
    """Operators copied whole to every device (nothing split)."""
    return sum(math.prod(s.degrees) == 1 for s in plan.strategies.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--clusters", nargs="+", default=list(CLUSTERS))
    parser.add_argument("--memory", type=float, default=1e18, help="bytes per device (none)")
    args = parser.parse_args()
    print(
        "| model | cluster | devices | step time (ms) | compute | exposed | communication-only "
        "plan: step time | compute | exposed | communication-only plan's step / the search's "
        "| operators that differ | copied whole with `replicate=True`: step time / comm. only |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    timed = Pricing()
    for preset in args.clusters:
        for nodes in args.nodes:
            cluster = taps.Cluster.preset(preset, nodes)
            for name in args.models:
                t0 = time.perf_counter()
                graph = taps.models.by_name(name)
                limit = {"memory_limit": args.memory}
                ours = taps.search(graph, cluster, timed, **limit)
                comm = taps.search(graph, cluster, Pricing(compute=False), **limit)
                comm_step = taps.step_time(comm.plan.with_pricing(timed))
                step = ours.step
                differ = sum(
                    ours.plan.strategies[k] != comm.plan.strategies[k] for k in ours.plan.strategies
                )
                rep = taps.search(graph, cluster, timed, replicate=True, **limit).plan
                rep_comm = taps.search(
                    graph, cluster, Pricing(compute=False), replicate=True, **limit
                ).plan
                ops = len(graph.ops)
                print(
                    f"| {name} | {preset} | {cluster.num_devices} | {_ms(step.step_time)} | "
                    f"{_ms(step.compute)} | {_ms(step.exposed)} | {_ms(comm_step.step_time)} | "
                    f"{_ms(comm_step.compute)} | {_ms(comm_step.exposed)} | "
                    f"{comm_step.step_time / step.step_time:.2f}x | {differ} of {ops} | "
                    f"{_whole(rep)} / {_whole(rep_comm)} of {ops} |",
                    flush=True,
                )
                print(f"{name} {preset} {nodes}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
