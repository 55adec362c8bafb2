"""The torch engine's speed targets: transformers' 2-layer Llama (tests/torch_models.py: hidden
64, 4 heads, 16 tokens of batch 2, token ids in) verified in the training step on 16 devices of
the fake process group (target: at most 30 s), and its numbers on 4 gloo ranks (target: at most
60 s).

    python benches/verify_torch.py            # both
    python benches/verify_torch.py --repeat 3 # the best of three

Prints one line per measurement (wall clock on this machine, the model's build, export and the
search included, as ``taps verify --engine torch`` runs them) and exits 1 when a target is missed
or the verification fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import taps
from taps.frontends.torch import from_torch
from taps.verify import verify_torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from torch_models import llama

#: Seconds: the fake process group at 16 devices, and the numbers on 4 gloo ranks.
TARGETS = {"fake 16": 30.0, "gloo 4": 60.0}


def once(nodes: int, per_node: int, numerics: int | None) -> tuple[float, taps.VerifyResult]:
    """One verification of the 2-layer Llama, from building it to the verdict."""
    t = time.perf_counter()
    module, ids = llama(layers=2)
    plan = taps.search(from_torch(module, ids), taps.Cluster(nodes, per_node)).plan
    result = verify_torch(module, [ids], plan, numerics=numerics)
    return time.perf_counter() - t, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; the best is kept")
    args = parser.parse_args()
    failed = False
    for name, (nodes, per_node, numerics) in {
        "fake 16": (2, 8, None),
        "gloo 4": (1, 4, 4),
    }.items():
        runs = [once(nodes, per_node, numerics) for _ in range(args.repeat)]
        seconds, result = min(runs, key=lambda r: r[0])
        rows = sum(c.measured_bytes is not None for c in result.collectives)
        timings = "  ".join(f"{k} {v:.2f} s" for k, v in result.timings.items())
        print(
            f"llama 2 layers, {name}: {seconds:.1f} s (target {TARGETS[name]:.0f} s)  "
            f"{'OK' if result.ok else 'MISMATCH'}  {rows} collectives  max error "
            f"{result.max_error:.2g}  {timings}"
        )
        failed |= not result.ok or seconds > TARGETS[name]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
