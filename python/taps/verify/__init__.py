"""Every plan verified by running it: taps' own steps replayed on XLA under ``shard_map`` with
simulated CPU devices (the whole training step, forward and backward, by taps' plans; or the
paper's model), every compiled collective matched with taps' prediction, and the results
compared with an unsharded run; taps' plan against XLA's own partitioner; and a torch module's
plan on PyTorch DTensor (fake process group and gloo ranks; docs/verify.md)."""

from __future__ import annotations

import sys
import types

from taps.errors import VerifyError
from taps.verify.devices import jax_with_devices, simulate_cpu_devices
from taps.verify.gspmd import GspmdReport, Traffic, compare_gspmd
from taps.verify.hlo import HloCollective, collectives, replica_groups
from taps.verify.replay import verify, verify_graph, verify_redistribution, verify_redistributions
from taps.verify.result import CollectiveCheck, Predicted, VerifyResult
from taps.verify.torch_engine import verify_torch

__all__ = [
    "CollectiveCheck",
    "GspmdReport",
    "HloCollective",
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
    "verify_graph",
    "verify_redistribution",
    "verify_redistributions",
    "verify_torch",
]


class _CallableModule(types.ModuleType):
    """``taps.verify(...)`` runs :func:`verify`, while ``taps.verify.hlo`` and the rest stay
    reachable as the package's modules."""

    __call__ = staticmethod(verify)


sys.modules[__name__].__class__ = _CallableModule
