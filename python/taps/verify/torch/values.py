"""The values of a torch run, seeded: the module and its inputs in the run's dtype on a device
(random values for what is on the meta device), and backward from the outputs with random
cotangents. The fake-process-group run (:mod:`.engine`) and every gloo rank (:mod:`.numerics`)
make them alike."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from taps._support.extras import require
from taps.errors import VerifyError
from taps.export.distribute import DistributedModule
from taps.verify.result import check_dtype


def import_torch() -> Any:
    """``torch``, or a ``MissingExtraError`` naming the extra."""
    return require("torch", "torch", "verifying a plan on PyTorch")


def torch_dtype(name: str) -> Any:
    """The torch dtype a run takes, by name."""
    check_dtype(name)
    return getattr(import_torch(), name)


def cast_inputs(inputs: Sequence[Any], dtype: Any, device: str, seed: int) -> list[Any]:
    """Floating inputs as ``dtype`` on ``device`` (meta inputs get seeded random values);
    ``requires_grad`` kept."""
    torch = import_torch()
    gen = torch.Generator().manual_seed(seed)
    out = []
    for x in inputs:
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        if not x.is_floating_point():
            raise VerifyError(f"the torch engine takes floating inputs only, got {x.dtype}")
        value = torch.randn(x.shape, generator=gen) if x.is_meta else x.detach().cpu()
        out.append(value.to(device=device, dtype=dtype).requires_grad_(x.requires_grad))
    return out


def materialize(module: Any, dtype: Any, device: str, seed: int) -> Any:
    """A copy of ``module`` in ``dtype`` on ``device``; a module on the meta device gets seeded
    random values (``1/sqrt(fan-in)`` scale) for every parameter and buffer."""
    torch = import_torch()
    module = copy.deepcopy(module)
    if device == "meta":
        return module.to(device="meta", dtype=dtype)
    if any(t.is_meta for t in [*module.parameters(), *module.buffers()]):
        module = module.to_empty(device=device)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                if t.is_floating_point():
                    scale = 1 / t.shape[-1] ** 0.5 if t.dim() > 1 else 1.0
                    t.copy_(torch.randn(t.shape, generator=gen) * scale)
    return module.to(device=device, dtype=dtype)


def backward(dist: DistributedModule, outs: Any, seed: int) -> list[Any]:
    """Backward from every output with a random cotangent in the output's placements; the
    whole cotangents, in output order (``None`` for an output without a gradient)."""
    torch = import_torch()
    dtensor = require("torch.distributed.tensor", "torch", "verifying a plan on PyTorch")
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    gen = torch.Generator().manual_seed(seed + 1)
    tensors: list[Any] = []
    cts: list[Any] = []
    fulls: list[Any] = []
    for y in outs:
        if not isinstance(y, dtensor.DTensor) or not y.requires_grad:
            fulls.append(None)
            continue
        full = torch.randn(y.shape, generator=gen).to(device=y.device.type, dtype=y.dtype)
        fulls.append(full)
        if any(p.is_partial() for p in y.placements):
            y = y.redistribute(
                dist.mesh, [dtensor.Replicate() if p.is_partial() else p for p in y.placements]
            )
        cts.append(
            dtensor.distribute_tensor(full, dist.mesh, list(y.placements), src_data_rank=None)
        )
        tensors.append(y)
    if tensors:
        torch.autograd.backward(tensors, cts)
    return fulls


def user_specs(dist: DistributedModule) -> list[Any]:
    """The specs of the module's own inputs, in order."""
    return [s for s in dist.program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
