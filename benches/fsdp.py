"""Parameter storage sharding (FSDP / ZeRO-3) where memory binds: the search with
``Pricing(fsdp=True)`` against the same search without it, on torchtitan's Llama 3 8B (batch 16 x
8,192, bf16, SDPA) and on GPT-3 175B (96 layers of hidden 12,288 as one layer standing for 96,
batch 16 x 2,048), on dgx-h100 nodes under a device memory limit (docs/search.md
#parameter-storage-sharding).

    python benches/fsdp.py                  # the cases below
    python benches/fsdp.py --quick          # Llama 3 8B only

Per case and search: the memory per device of the plan, its step time (the timeline's: compute
and exposed communication), what the search minimised, the search's time, and which operators
store their parameters sharded (the distinct ones, layer numbers dropped), or the one-line
refusal when no plan fits.
"""

from __future__ import annotations

import argparse
import re
import time
from collections import Counter

import taps
from frontend_torch import tied_llama3


def _distinct(names: tuple[str, ...]) -> str:
    """Operator names with layer numbers dropped, counted."""
    counts = Counter(re.sub(r"\.\d+\.", ".N.", n) for n in names)
    return ", ".join(f"{n} x{c}" if c > 1 else n for n, c in sorted(counts.items()))


def run(label: str, graph: taps.Graph, cluster: taps.Cluster, limit: float) -> None:
    print(f"{label}: {cluster.num_devices} devices, limit {limit / 1e9:g} GB per device")
    for fsdp in (False, True):
        t0 = time.perf_counter()
        try:
            r = taps.search(graph, cluster, taps.Pricing(fsdp=fsdp), memory_limit=limit)
        except taps.InfeasibleError as e:
            print(f"  fsdp={fsdp}: {e}")
            continue
        seconds = time.perf_counter() - t0
        step = r.step
        sharded = r.plan.pricing.fsdp or ()
        print(
            f"  fsdp={fsdp}: memory {r.memory_per_device / 1e9:.1f} GB, step "
            f"{step.step_time * 1e3:.1f} ms (compute {step.compute * 1e3:.1f}, exposed "
            f"{step.exposed * 1e3:.1f}), objective {r.cost * 1e3:.1f} ms, search {seconds:.2f} s; "
            f"{len(sharded)} operators sharded" + (f": {_distinct(sharded)}" if sharded else "")
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Llama 3 8B only")
    args = parser.parse_args()
    llama = tied_llama3("8B", 16, 8192)
    for nodes, limit in ((8, 80e9), (8, 40e9), (4, 80e9)):
        run("llama3-8B", llama, taps.Cluster.preset("dgx-h100", nodes), limit)
    if args.quick:
        return
    gpt3 = taps.models.gpt(12288, 96, 2048, 16, layers=96, name="gpt3-175B")
    for nodes, limit in ((16, 80e9), (8, 80e9)):
        run("gpt3-175B", gpt3, taps.Cluster.preset("dgx-h100", nodes), limit)


if __name__ == "__main__":
    main()
