"""Every plan verified by running it on an engine, against what taps predicts for it.

This package owns the engine-neutral part: what taps predicts a plan runs (:mod:`.prediction`)
and the records every engine fills in, their pairing and the verdict (:mod:`.result`). The
engines run the plan: XLA (:mod:`.xla`: taps' own steps replayed under ``shard_map`` on
simulated CPU devices, the whole training step or the paper's model, every compiled collective
read from the HLO; and taps' plan against XLA's own partitioner) and PyTorch DTensor
(:mod:`.torch`: the fake process group at the full world size, and gloo ranks for the numbers).
docs/verify.md has the details."""

from __future__ import annotations

import sys
import types

from taps.errors import VerifyError
from taps.verify.result import CollectiveCheck, Measured, Predicted, VerifyResult
from taps.verify.torch.engine import verify_torch
from taps.verify.xla.devices import jax_with_devices, simulate_cpu_devices
from taps.verify.xla.gspmd import GspmdReport, Traffic, compare_gspmd
from taps.verify.xla.hlo import HloCollective, collectives, replica_groups
from taps.verify.xla.replay import verify, verify_redistribution, verify_redistributions

__all__ = [
    "CollectiveCheck",
    "GspmdReport",
    "HloCollective",
    "Measured",
    "Predicted",
    "Traffic",
    "VerifyError",
    "VerifyResult",
    "collectives",
    "compare_gspmd",
    "jax_with_devices",
    "replica_groups",
    "simulate_cpu_devices",
    "verify",
    "verify_redistribution",
    "verify_redistributions",
    "verify_torch",
]


class _CallableModule(types.ModuleType):
    """``taps.verify(...)`` runs :func:`verify`, while ``taps.verify.xla`` and the rest stay
    reachable as the package's modules."""

    __call__ = staticmethod(verify)


sys.modules[__name__].__class__ = _CallableModule
