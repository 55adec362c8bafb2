"""A PyTorch model as a graph: a ``torch.nn.Module`` exported with ``torch.export`` and
converted (its repeated blocks tied), a saved ``torch.export`` archive, or a factory named
``package.module:factory``."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from taps._core import GraphError
from taps.frontends.torch._extra import require_torch
from taps.frontends.torch.blocks import repeated_blocks
from taps.frontends.torch.instances import NotRepeated, cuts, instanced, truncated
from taps.frontends.torch.program import Conversion, check_unknown, convert
from taps.frontends.torch.rules import flat
from taps.graph import Graph


def from_torch(
    module: Any,
    *example_inputs: Any,
    unknown: str = "error",
    tie: bool = True,
    name: str | None = None,
    kwargs: Mapping[str, Any] | None = None,
    rows: bool = True,
    once: bool = True,
) -> Graph:
    """The graph of ``module`` called on ``example_inputs`` (and keyword ``kwargs``).

    Build the module and the inputs on the meta device (``with torch.device("meta"):``) to
    convert a model of any size without allocating it. Parameter names are the module's
    ``state_dict`` keys, operator names its module paths (``layers.3.attention.wo``; a module
    that makes several operators gives ``path.kind``). An input with ``requires_grad`` stands
    for an earlier layer's output (its gradient flows back).

    With ``rows`` (the default), operators on (batch, seq, features) tensors other than
    attention (linear layers, norms, elementwise operators, embeddings) see batch * seq as one
    rows axis, as Megatron-LM's 2-D matmuls and :func:`taps.models.gpt` do: far fewer
    strategies to search; ``rows=False`` keeps batch and sequence apart (sequence splits too).

    ``unknown="error"`` raises :class:`taps.GraphError` listing every operator without a rule;
    ``"replicate"`` keeps such operators whole (no partitionable axis). With ``tie``, identical
    repeated blocks (children of a ``ModuleList``, ``ModuleDict`` or ``Sequential``) are declared
    with :meth:`Graph.tie`. With ``once`` (the default), layers that repeat are exported once
    and their operators copied (:mod:`taps.frontends.torch.instances`): the same graph, in the
    time of a few layers' export.
    """
    torch = require_torch()
    if not isinstance(module, torch.nn.Module):
        raise GraphError(f"from_torch needs a torch.nn.Module, got {type(module).__name__}")
    check_unknown(unknown)
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"from_torch: kwargs must map names to inputs, got {type(kwargs).__name__}")
    grads = [
        bool(getattr(t, "requires_grad", False))
        for t in flat([*example_inputs, *(kwargs or {}).values()])
        if isinstance(t, torch.Tensor)
    ]
    name = name or type(module).__name__
    conversion = _once(module, example_inputs, kwargs, unknown, name, grads, rows) if once else None
    if conversion is None:
        program = export_program(module, example_inputs, kwargs)
        conversion = convert(program, unknown, name, grads, rows)
    if tie:
        for instances in repeated_blocks(conversion, module):
            conversion.graph.tie(instances)
    return conversion.graph


def export_program(
    module: Any, example_inputs: Sequence[Any], kwargs: Mapping[str, Any] | None = None
) -> Any:
    """``torch.export.export(module, example_inputs, kwargs)``, a transformers model's
    key/value cache off; a failure is one :class:`taps.GraphError` with torch's first line."""
    torch = require_torch()
    try:
        with _without_cache(module):
            return torch.export.export(module, tuple(example_inputs), dict(kwargs or {}))
    except Exception as e:  # torch raises many kinds; the user needs the message, once
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GraphError(f"torch.export failed on {type(module).__name__}: {first}") from None


def drop_cache(module: Any) -> bool:
    """Turn ``config.use_cache`` off; whether it was on. A transformers model with it on returns
    its key/value cache, an object torch.export cannot output and no part of a training step."""
    config: Any = getattr(module, "config", None)
    if getattr(config, "use_cache", None) is not True:
        return False
    config.use_cache = False
    return True


@contextmanager
def _without_cache(module: Any) -> Iterator[None]:
    """:func:`drop_cache` while exporting, then the module as it was."""
    dropped = drop_cache(module)
    try:
        yield
    finally:
        if dropped:
            module.config.use_cache = True


def _once(
    module: Any,
    example_inputs: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
    unknown: str,
    name: str,
    grads: list[bool],
    rows: bool,
) -> Conversion | None:
    """The conversion of ``module`` with its repeated layers exported once, or ``None`` when
    it has none, or its prefix does not export or does not show the copies right."""
    found = cuts(module)
    if not found:
        return None
    try:
        with truncated(module, found):
            program = export_program(module, example_inputs, kwargs)
    except Exception:  # a module that needs all its layers (it indexes them): export it whole
        return None
    try:
        return instanced(convert(program, unknown, name, grads, rows), found)
    except (GraphError, NotRepeated):
        return None  # the whole export says what is wrong, or converts what this could not


class _Reasons(logging.Handler):
    """The exceptions torch logs while it loads an archive (it then raises one that says only
    "check the warnings above", which are hidden unless asked for)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.errors: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.errors.append(record.exc_info[1])


def load(path: str, unknown: str = "error", name: str | None = None) -> Graph:
    """The graph of a saved ``torch.export`` archive (``.pt2``)."""
    torch = require_torch()
    reasons, logger = _Reasons(), logging.getLogger("torch.export")
    logger.addHandler(reasons)
    try:
        program = torch.export.load(path)
    except Exception as e:
        said = _first_line(reasons.errors[0]) if reasons.errors else str(e)
        raise GraphError(f"cannot load torch.export archive {path!r}: {said}") from None
    finally:
        logger.removeHandler(reasons)
    return convert(program, unknown, name or path.rsplit("/", 1)[-1].removesuffix(".pt2")).graph


#: What the user's code may raise that is theirs: any error, and an exit (``sys.exit()`` in a
#: module or factory ends the conversion, not the program); Ctrl-C stays an interrupt.
_USERS = (Exception, SystemExit, GeneratorExit)


def _first_line(error: BaseException) -> str:
    """An exception of the user's code as one line: its type and its message's first line."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def load_factory(spec: str) -> tuple[Any, tuple[Any, ...]]:
    """``(module, inputs)`` made by ``package.module:factory``, a callable returning the module
    and its example inputs (a tuple or a single tensor)."""
    torch = require_torch()
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise GraphError(f"{spec!r} is not package.module:factory")
    # The directory the command runs in, as `python -m` has it, but last: a user's file is found
    # beside them without PYTHONPATH, and never shadows an installed package.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        imported = importlib.import_module(module_name)
    except ImportError as e:
        raise GraphError(f"cannot import {module_name!r}: {e}") from None
    except _USERS as e:  # the user's module failed as it ran: theirs to fix, said as such
        raise GraphError(f"importing {module_name!r} raised {_first_line(e)}") from None
    factory = getattr(imported, attr, None)
    if factory is None:
        raise GraphError(f"module {module_name!r} has no {attr!r}")
    if not callable(factory):
        raise GraphError(f"{spec} is not callable")
    try:
        made = factory()
    except _USERS as e:  # the user's factory failed
        raise GraphError(f"the factory {spec} raised {_first_line(e)}") from None
    if not (isinstance(made, tuple) and len(made) == 2):
        raise GraphError(f"{spec} must return (module, inputs), got {type(made).__name__}")
    module, inputs = made
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    return module, tuple(inputs)


def from_factory(spec: str, unknown: str = "error", tie: bool = True) -> Graph:
    """The graph of ``package.module:factory`` (:func:`load_factory`), converted by
    :func:`from_torch`."""
    module, inputs = load_factory(spec)
    return from_torch(module, *inputs, unknown=unknown, tie=tie, name=spec.partition(":")[2])
