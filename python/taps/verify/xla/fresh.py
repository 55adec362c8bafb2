"""Verification in a fresh process, for a process whose JAX started with too few devices.

``python -m taps.verify.xla.fresh DTYPE SEED VALUES`` reads a plan on stdin
(:meth:`taps.Plan.to_json`) and the values given for some of its parameters and inputs from the
``.npz`` file ``VALUES``, verifies it (:func:`taps.verify.xla.replay.verify`), and writes the
result's JSON on stdout; an error is ``{"error": message}`` and exit code 2. The caller's side is
in :mod:`.replay`, which starts this module without importing it.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from taps._core import TapsError
from taps.plan.plan import Plan
from taps.verify.xla.replay import verify


def main() -> int:
    """Verify the plan on stdin; its result on stdout."""
    dtype, seed = sys.argv[1], int(sys.argv[2])
    try:
        # verify asks XLA for the plan's devices before JAX starts (the parent dropped its flag).
        with np.load(sys.argv[3]) as given:
            values = {k: given[k] for k in given.files}
        result = verify(Plan.from_json(sys.stdin.read()), dtype, seed, values)
    except TapsError as e:
        sys.stdout.write(json.dumps({"error": str(e)}))
        return 2
    sys.stdout.write(result.to_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
