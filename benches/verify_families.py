"""The torch engine on every model of the model-family tests: each family (``MODELS`` of
tests/test_frontend_models.py, built by tests/torch_factories.py) converted, searched on
``taps.Cluster(1, 4)`` and its training step verified on the fake process group, in a fresh
interpreter per model, as ``taps verify --engine torch`` runs it.

    python benches/verify_families.py                 # every family
    python benches/verify_families.py tv_efficientnet # some of them

Prints one line per model: ``ok`` (every issued collective matched to a prediction, none
unpriced), the first mismatch, or the one-line error; and the CPU and wall time of the
verification (the search excluded). Exits 1 if any model does not verify.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from peak_memory import in_fresh_process

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def verified(name: str) -> tuple[str, float, float]:
    """(verdict, CPU seconds, wall seconds) of one family's verification on 1 x 4 devices."""
    import taps
    import torch_factories
    from taps.frontends.torch import from_torch
    from taps.verify import verify_torch

    module, inputs = getattr(torch_factories, name)()
    module.train()
    plan = taps.search(from_torch(module, *inputs), taps.Cluster(1, 4)).plan
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        result = verify_torch(module, list(inputs), plan, numerics=None)
        verdict = (
            "ok" if result.ok else f"MISMATCH ({len(result.mismatches)}): {result.mismatches[0]}"
        )
    except Exception as e:  # the bench reports every family, whatever one of them raises
        verdict = (
            f"ERROR {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        )
    return verdict, time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    from test_frontend_models import MODELS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="names (default: every family)")
    names = parser.parse_args().models or [m for m, _ in MODELS]
    failed = []
    for name in names:
        (verdict, cpu, wall), _ = in_fresh_process(verified, name)
        print(f"{name:22s} {verdict[:160]}  verify CPU {cpu:.1f} s, wall {wall:.1f} s", flush=True)
        if verdict != "ok":
            failed.append(name)
    print(
        f"{len(names) - len(failed)} of {len(names)} verify"
        + (f"; not: {failed}" if failed else "")
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
