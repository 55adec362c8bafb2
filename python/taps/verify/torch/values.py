"""The values of a torch run, seeded: the module and its inputs in the run's dtype on a device
(random values for what is on the meta device), and backward from the outputs with random
cotangents. The fake-process-group run (:mod:`.engine`) and every gloo rank (:mod:`.numerics`)
make them alike."""

from __future__ import annotations

import copy
import logging
import math
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from taps._support.extras import require
from taps.errors import VerifyError
from taps.export.distribute import DistributedModule
from taps.frontends.torch import drop_cache
from taps.verify.result import check_dtype


def import_torch() -> Any:
    """``torch``, or a ``MissingExtraError`` naming the extra."""
    return require("torch", "torch", "verifying a plan on PyTorch")


def torch_dtype(name: str) -> Any:
    """The torch dtype a run takes, by name."""
    check_dtype(name)
    return getattr(import_torch(), name)


def token_bound(module: Any) -> int:
    """The bound of random integer inputs: the smallest embedding table of ``module`` (token ids
    index every table), 2 without one."""
    torch = import_torch()
    sizes = [m.num_embeddings for m in module.modules() if isinstance(m, torch.nn.Embedding)]
    return min(sizes, default=2)


def cast_inputs(
    inputs: Sequence[Any], dtype: Any, device: str, seed: int, bound: int = 2
) -> list[Any]:
    """Floating inputs as ``dtype`` on ``device`` (meta inputs get seeded random values),
    ``requires_grad`` kept; integer inputs (token ids) as they are, meta ones seeded random
    integers below ``bound`` (:func:`token_bound`)."""
    torch = import_torch()
    gen = torch.Generator().manual_seed(seed)
    out = []
    for x in inputs:
        if not isinstance(x, torch.Tensor):
            out.append(x)
        elif not x.is_floating_point():
            if x.is_complex() or x.dtype == torch.bool:
                raise VerifyError(
                    f"the torch engine takes floating or integer inputs, got {x.dtype}"
                )
            value = torch.randint(0, bound, x.shape, generator=gen) if x.is_meta else x.cpu()
            out.append(value.to(device=device, dtype=x.dtype))
        else:
            value = torch.randn(x.shape, generator=gen) if x.is_meta else x.detach().cpu()
            out.append(value.to(device=device, dtype=dtype).requires_grad_(x.requires_grad))
    return out


def materialize(module: Any, dtype: Any, device: str, seed: int) -> Any:
    """A copy of ``module`` in ``dtype`` on ``device``; a module on the meta device gets seeded
    random values (``1/sqrt(fan-in)`` scale) for every parameter and buffer (running variances
    positive; integer buffers, such as position or token-type ids, below
    :func:`token_bound`), its tied weights kept tied."""
    torch = import_torch()
    module = copy.deepcopy(module)
    drop_cache(module)  # the step's copy: a training step keeps no key/value cache
    tied: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        tied.setdefault(id(p), []).append(name)
    if device == "meta":
        # Moving a module between devices makes each key a tensor of its own.
        return _retied(module.to(device="meta", dtype=dtype), tied.values())
    if any(t.is_meta for t in [*module.parameters(), *module.buffers()]):
        bound = token_bound(module)
        module = _retied(module.to_empty(device=device), tied.values())
        gen = torch.Generator().manual_seed(seed)
        # A convolution's fan-in is its input channels times its kernel: scaled by the kernel's
        # width alone, a deep convnet's activations grow layer by layer until float32 cannot
        # tell a right plan from a wrong one (EfficientNet's gradients off by 4%).
        convolutions = {
            id(m.weight) for m in module.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)
        }
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                if t.is_floating_point():
                    scale = 1.0  # a vector or a number (CLIP's logit scale has no dims)
                    if t.dim() > 1:
                        fan_in = math.prod(t.shape[1:]) if id(t) in convolutions else t.shape[-1]
                        scale = 1 / fan_in**0.5
                    t.copy_(torch.randn(t.shape, generator=gen) * scale)
                elif t.dtype != torch.bool:  # ids kept in buffers index every table
                    t.copy_(torch.randint(0, bound, t.shape, generator=gen))
            for m in module.modules():  # a variance is positive (eval-mode BatchNorm divides)
                if isinstance(getattr(m, "running_var", None), torch.Tensor):
                    m.running_var.abs_().add_(0.5)
    return _retied(module.to(device=device, dtype=dtype), tied.values())


def _retied(module: Any, tied: Iterable[list[str]]) -> Any:
    """``module`` with each group of ``tied`` parameter names one parameter again (its first)."""
    for first, *others in tied:
        for name in others:
            owner, _, attr = name.rpartition(".")
            setattr(module.get_submodule(owner), attr, module.get_parameter(first))
    return module


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


def placed_inputs(dist: DistributedModule, xs: Sequence[Any]) -> list[Any]:
    """The module's inputs placed as the plan reads them (a ``None``, an absent mask, as it
    is)."""
    torch = import_torch()
    return [
        dist.distribute_input(s.arg.name, x) if isinstance(x, torch.Tensor) else x
        for s, x in zip(user_specs(dist), xs)
    ]


#: The fx interpreter's note of the node a failure happened at.
_NODE = re.compile(r"While executing %(\S+)")


@contextmanager
def replaying() -> Iterator[None]:
    """A run of the replay: torch's own logs and warnings silenced (the fallbacks of a CPU
    process group, export's notes), and anything that goes wrong inside torch one
    :class:`VerifyError` naming the node of the module's program it happened at."""
    loggers = [logging.getLogger(name) for name in ("torch", "torch.distributed")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    except VerifyError:
        raise
    except Exception as e:  # torch raises many kinds from deep inside: said once, in one line
        text = str(e).strip()
        node = _NODE.search(text)
        first = text.splitlines()[0] if text else type(e).__name__
        where = f" at node {node.group(1)}" if node else ""
        raise VerifyError(f"the torch replay failed{where}: {first}") from None
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
