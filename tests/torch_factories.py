"""Factories for ``taps import`` and ``taps search --torch`` in the tests:
``torch_factories:<name>`` returns ``(module, inputs)`` built on the meta device."""

from __future__ import annotations

import torch
from torch import nn


def mlp() -> tuple[nn.Module, torch.Tensor]:
    with torch.device("meta"):
        module = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).half()
        return module, torch.empty(32, 64, dtype=torch.half)


def not_a_pair() -> nn.Module:
    return nn.Linear(4, 4)


def raises() -> tuple[nn.Module, torch.Tensor]:
    raise ValueError("the config has no field 'hidden'\nsecond line")


#: Not callable: ``torch_factories:CONSTANT`` names a value.
CONSTANT = 3
